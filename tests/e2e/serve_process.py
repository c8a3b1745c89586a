"""A `dinfer serve` process for the end-to-end tests (standard library only): started on a free
loopback port, waited for until /health answers, queried with urllib, stopped with SIGTERM."""
import json
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


class ServeProcess:
    """`binary serve model --host 127.0.0.1 --port 0 flags...`, its output in a temporary file."""

    def __init__(self, binary, model, *flags, start_timeout=60):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self.proc = subprocess.Popen([binary, "serve", model, "--host", "127.0.0.1", "--port", "0", *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + start_timeout
        self.port = None
        while self.port is None:
            assert self.proc.poll() is None, self.output()
            assert time.time() < deadline, "the server did not start listening"
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.output())
            self.port = int(m.group(1)) if m else None
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"
        while self.get("/health")[0] != 200:
            assert self.proc.poll() is None, self.output()
            assert time.time() < deadline, "the model did not load"
            time.sleep(0.1)

    def output(self):
        with open(self.log.name) as f:
            return f.read()

    def get(self, path, headers=None):
        """(status, body text)."""
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body, headers=None):
        """(status, body text); body bytes, or JSON-encoded."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self, timeout=30):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        assert code == 0, self.output()
