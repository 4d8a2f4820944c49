"""Built-in structured-output backends: xgrammar (the default) and llguidance."""
