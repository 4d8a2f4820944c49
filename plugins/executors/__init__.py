"""Built-in executors: ``uni`` (in-process), ``mp`` (one process per rank), ``ray`` (Ray actors)."""
