"""The launcher: jaxrun's own process, from the parsed command line to the exit status.

``configure`` turns the command line's values into one ``RunConfig``, ``plan``
turns it into one spec per process, and ``run`` places, starts, supervises and
reports every attempt through the backend the registry builds.
"""
