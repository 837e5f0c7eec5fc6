"""The contract between jaxrun's parts: the one package every side imports.

The launcher (``jaxrun.launcher``), the backends and their far-end agents
(``jaxrun.backends``), the child side (``jaxrun.child``) and the reports
(``jaxrun.reporting``) never import each other's internals to agree on a
name.  Everything they must agree on is here:

- every environment variable jaxrun sets or reads (no ``JAXRUN_*`` name is
  spelled anywhere else);
- the module names put on command lines, and the shim's command line;
- the argument placeholders and their substitution;
- exit statuses: Popen's negative signal numbers against the shell's 128+N;
- the error record a child leaves behind for the run summary;
- how a part picks a port: bind one address, never a wildcard.

The messages that cross a socket are in :mod:`jaxrun.wire`.  Nothing here
imports jax.
"""

# One namespace for the users of the contract (``contract.ERROR_FILE``,
# ``contract.ErrorRecord``): the split into names, rules and records is for
# its readers, not its users.
from jaxrun.contract.helpers import *  # noqa: F401,F403
from jaxrun.contract.names import *  # noqa: F401,F403
from jaxrun.contract.records import *  # noqa: F401,F403
from jaxrun.contract.traces import *  # noqa: F401,F403
