"""What follows the end of a process or an attempt: the one restart policy
(``restarts.policy``), a recoverable job's rules and the elastic choice of hosts."""
