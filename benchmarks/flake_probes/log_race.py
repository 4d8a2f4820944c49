"""Probe (not a test): right after a completion's response arrives, is the server's 'Received request' line for it in the log yet?"""
import sys
import tempfile

import httpx

from octavo.server.launch import ServerProcess

log = tempfile.mkstemp(suffix="_server.log")[1]
with ServerProcess(["--max-model-len", "256", "--kv-cache-memory-bytes", str(32 << 20), "--uvicorn-log-level", "warning",
                    "--enable-log-requests", "--max-log-len", "48"], log_path=log) as srv:
    missing = 0
    n = int(sys.argv[1])
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for i in range(n):
            tag = f"probe{i:04d}"
            c.post("/v1/completions", json={"prompt": f"{tag} A long prompt", "max_tokens": 1})
            text = open(log, errors="replace").read()
            if not any("Received request" in ln and tag in ln for ln in text.splitlines()):
                missing += 1
    print(f"{missing}/{n} responses arrived before the server had logged their request line")
