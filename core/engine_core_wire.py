"""The one-byte message kinds on the ZeroMQ sockets between a front end and an engine-core process.

A module of its own so both ends (``engine_core_proc``, ``engine_client``, ``dp_engine_core``) share them
without importing each other.
"""

# Front end -> core (first frame of every message).
ADD, ABORT, UTILITY, SHUTDOWN = b"A", b"X", b"U", b"S"
# Core -> front end.
READY, OUTPUTS, FATAL = b"R", b"O", b"E"
