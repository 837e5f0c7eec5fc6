"""Before any process starts: the command line's values to one frozen RunConfig, the
plan (one ProcessSpec per process), hosts files and local devices.  Pure: nothing
here starts a process."""
