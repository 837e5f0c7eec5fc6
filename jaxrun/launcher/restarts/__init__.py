"""What follows the end of a process or an attempt: the one restart policy
(``policy.decide``), a recoverable job's rules and the elastic choice of hosts."""
