"""What the launcher sees of the process: the main thread's sampler (the stall watchdog's
activity and the time account), stack dumps, traces, and the marks."""
