"""The console view of children's output (unit tests; the log files are tested end to end)."""

import io

from jaxrun.core.events import Stream
from jaxrun.launcher.output.printer import ConsolePrinter


def printer(**kw):
    out, err = io.BytesIO(), io.BytesIO()
    return ConsolePrinter(stdout=out, stderr=err, **kw), out, err


def test_every_line_of_a_chunk_gets_the_rank_prefix():
    p, out, _ = printer()
    p.write(3, Stream.STDOUT, b"a\nb b\n\n")
    p.write(3, Stream.STDOUT, b"partial")
    assert out.getvalue() == b""  # gathered until the pump's round ends
    p.flush()
    assert out.getvalue() == b"[3] a\n[3] b b\n[3] \n[3] partial\n"


def test_noise_and_stack_dumps_are_hidden_on_the_console_only():
    p, out, err = printer()
    p.write(0, Stream.STDOUT, b"[Gloo] Rank 0 is connected to 3 peer ranks. "
                              b"Expected number of connected peer ranks is : 3\nreal\n")
    p.write(1, Stream.STDERR, b"warning\nCurrent thread 0x00007f (most recent call first):\n"
                              b'  File "x.py", line 3 in f\n\n')
    p.write(1, Stream.STDERR, b'  File "y.py", line 9 in <module>\nTraceback (most recent call last):\n')
    p.write(1, Stream.STDERR, b'  File "y.py", line 9, in <module>\nValueError: x\n')  # held until its exception
    p.flush()
    assert out.getvalue() == b"[0] real\n"
    assert err.getvalue() == (b'[1] warning\n[1] Traceback (most recent call last):\n[1]   File "y.py", line 9, '
                              b'in <module>\n[1] ValueError: x\n')


def test_the_flight_recorders_block_is_hidden_on_the_console_like_a_stack_dump():
    from jaxrun import contract

    entries = [contract.FlightEntry(7, 6, "eval_step", 1, "2b139a406821", "f32[4,8]", "/w/train.py", 48),
               contract.FlightEntry(8, None, "add", 3, "015c5f5b34e1", "", "/w/train.py", 52)]
    block = contract.flight_block(2, 23, contract.IN_SCRIPT, entries).encode()
    assert block.count(b"\n") == 4
    p, _, err = printer()
    p.write(2, Stream.STDERR, b"before\n" + block)
    p.write(2, Stream.STDERR, b"jaxrun: flight[2] is a phrase a script may print\nafter\n")
    p.flush()
    assert err.getvalue() == (b"[2] before\n[2] jaxrun: flight[2] is a phrase a script may print\n"
                              b"[2] after\n")
    grouped, _, err = printer(mode="grouped")
    assert grouped.render(2, Stream.STDERR, block + b"last\n") == b"last\n"
    assert grouped.render(2, Stream.STDOUT, block) == block  # only stderr carries it


def test_a_notice_written_into_a_printed_line_hides_only_itself():
    # Gloo's C++ thread can write between a print's text and its newline.
    p, out, _ = printer()
    p.write(2, Stream.STDOUT, b"device cpu:4097 has local data [[20 21 22 23]]"
                              b"[Gloo] Rank 2 is connected to 3 peer ranks. "
                              b"Expected number of connected peer ranks is : 3\n"
                              b"\nafter\n")
    p.flush()
    assert out.getvalue() == b"[2] device cpu:4097 has local data [[20 21 22 23]]\n[2] \n[2] after\n"


def test_interleaved_pieces_of_two_notices_are_all_hidden():
    # Seen in real logs: two of Gloo's threads writing at once.
    p, out, _ = printer()
    p.write(3, Stream.STDOUT, b"[Gloo] Rank [Gloo] Rank 0 is connected to 1 peer ranks. "
                              b"Expected number of connected peer ranks is : 1 is connected to 1 peer ranks. "
                              b"Expected number of connected peer ranks is : 1\n"
                              b"Expected number of connected peer ranks is : 1\n[Gloo] Rank 0\nRank 0 is fine\n")
    p.flush()
    assert out.getvalue() == b"[3] Rank 0 is fine\n"


def test_verbose_shows_everything():
    p, out, _ = printer(show_noise=True)
    p.write(0, Stream.STDOUT, b"[Gloo] Rank 0\n")
    p.flush()
    assert out.getvalue() == b"[0] [Gloo] Rank 0\n"


def test_grouped_mode_prints_nothing_live():
    p, out, err = printer(mode="grouped")
    p.write(0, Stream.STDOUT, b"x\n")
    p.flush()
    assert out.getvalue() == b"" and err.getvalue() == b""
