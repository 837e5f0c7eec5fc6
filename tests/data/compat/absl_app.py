"""An absl app: flags parsed by app.run, messages through absl.logging."""
import jax
from absl import app, logging


def main(argv):
    coord, n, pid = argv[1], int(argv[2]), int(argv[3])
    logging.set_verbosity(logging.INFO)
    logging.info("starting process %d", pid)
    jax.distributed.initialize(coord, n, pid)
    logging.info("process %d of %d", jax.process_index(), jax.process_count())
    logging.warning("a warning from process %d", pid)


if __name__ == "__main__":
    app.run(main)
