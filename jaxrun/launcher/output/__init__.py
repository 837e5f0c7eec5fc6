"""Every byte the processes print: the pump, the console printer, and
``jaxrun logs`` over a finished run's files."""
