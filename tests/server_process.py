"""A ``gptzoo serve`` process for tests: started on a free loopback port, stopped with SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import openai


class Server:
    """A ``gptzoo serve`` process on a free loopback port."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gptzoo", "serve", *args, "--port", "0"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            found = re.search(r"at http://127\.0\.0\.1:(\d+)/v1", line)
            if found:
                self.port = int(found.group(1))
                break
        else:
            raise AssertionError(f"the server did not start: {''.join(self.lines)}")
        threading.Thread(target=self._drain, daemon=True).start()
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)

    def _drain(self) -> None:
        assert self.process.stderr is not None
        self.lines.extend(self.process.stderr)

    def raw(self, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, Any, str]:
        """Status, parsed JSON (or None) and the text of one HTTP request."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request(method, path, body=body, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        text = response.read().decode()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        return response.status, parsed, text

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)
