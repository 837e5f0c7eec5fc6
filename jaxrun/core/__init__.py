"""The shared layer below every side of jaxrun.

What the launcher, the backends and the reports all speak of lives here,
and imports nothing of them: a process's spec and the run's configuration
(``spec``, ``config``), what an attempt came to (``outcome``), the run
loop's typed events (``events``), the Backend and Child contract
(``backend``), the run's files (``logfiles``, ``noise``, ``ranks``), and
the process-tree tools the run loop and the far ends both use (``reaper``,
``usage``, ``joinwatch``).  Below it are only the contract, the wire
messages and the OS layer (``portable``).
"""
