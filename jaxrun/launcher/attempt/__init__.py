"""One attempt of a job, from its first spawn to its last exit: the supervisor's
loop, each process's slot and its states, the joins and the activity watch."""
