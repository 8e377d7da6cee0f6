#!/usr/bin/env python3
"""A minimal orl node agent: polls what its node must bind or unbind and reports back.

It calls `GET /v1/nodes/{nodeId}/bindings` every `--interval` seconds (each call also tells
the platform the node is alive, so keep the interval well under `--node-lost-after`), and
for every entry runs a hook (or nothing) and reports:

  bind    -> POST /v1/nodes/{nodeId}/bindings/{reservationId} {"status": "bound"}
             ({"status": "failed", "message": ...} when the bind hook fails)
  unbind  -> {"status": "allocation-released"} once the unbind hook succeeds (for a
             kubernetes binding: no pod holds the devices any more)

Hooks are shell commands that receive the entry as JSON on stdin and in the environment
(ORL_RESERVATION_ID, ORL_BINDING, ORL_ACTION, ORL_UNIT_IDS, ORL_TENANT_ID). A failing
unbind hook is retried on the next poll. Only the Python standard library is used.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


class Api:
    def __init__(self, base, key, timeout):
        self.base = base.rstrip("/")
        self.key = key
        self.timeout = timeout

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", "Bearer " + self.key)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            text = err.read()
            try:
                return err.code, json.loads(text)
            except ValueError:
                return err.code, text.decode(errors="replace")


def run_hook(command, entry):
    """Runs `command` for `entry`; returns (ok, message)."""
    if not command:
        return True, None
    env = dict(os.environ)
    env.update(
        ORL_RESERVATION_ID=entry["reservationId"],
        ORL_BINDING=entry["binding"],
        ORL_ACTION=entry.get("action", ""),
        ORL_UNIT_IDS=",".join(entry.get("unitIds", [])),
        ORL_TENANT_ID=entry.get("tenantId", ""),
    )
    try:
        done = subprocess.run(
            command,
            shell=True,
            input=json.dumps(entry).encode(),
            env=env,
            capture_output=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return False, "hook timed out after 300 s"
    output = (done.stdout + done.stderr).decode(errors="replace").strip()
    return done.returncode == 0, output[-1000:] or None


def handle(api, args, entry):
    rid = entry["reservationId"]
    path = f"/v1/nodes/{args.node}/bindings/{rid}"
    if entry.get("action") == "bind":
        ok, message = run_hook(args.bind_hook, entry)
        report = {"status": "bound" if ok else "failed"}
    elif entry.get("action") == "unbind":
        ok, message = run_hook(args.unbind_hook, entry)
        if not ok:
            log(f"unbind of {rid} not done yet: {message}")
            return
        report = {"status": "allocation-released"}
    else:
        return
    if message:
        report["message"] = message
    status, body = api.call("POST", path, report)
    if status == 200:
        log(f"{entry['action']} {rid} ({entry['binding']}, units {','.join(entry.get('unitIds', []))}): {report['status']}")
    else:
        log(f"report on {rid} refused ({status}): {body}")


def log(message):
    print(time.strftime("%H:%M:%S"), message, flush=True)


def pending(api, node):
    """Every entry the node must act on now, a page at a time (`cursor` continues a page)."""
    path = f"/v1/nodes/{node}/bindings"
    while True:
        status, page = api.call("GET", path)
        if status != 200:
            log(f"poll refused ({status}): {page}")
            return
        yield from page["items"]
        if "cursor" not in page:
            return
        path = f"/v1/nodes/{node}/bindings?cursor={urllib.parse.quote(page['cursor'])}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("ORL_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--key", default=os.environ.get("ORL_KEY"), help="an inventory.write key of the node's owner (or ORL_KEY)")
    parser.add_argument("--node", required=True, help="the node id")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between polls")
    parser.add_argument("--bind-hook", default=os.environ.get("ORL_BIND_HOOK"), help="shell command that binds an entry")
    parser.add_argument("--unbind-hook", default=os.environ.get("ORL_UNBIND_HOOK"), help="shell command that succeeds once the devices are free")
    parser.add_argument("--once", action="store_true", help="poll once and exit")
    args = parser.parse_args()
    if not args.key:
        parser.error("--key or ORL_KEY is required")
    api = Api(args.url, args.key, timeout=30)
    while True:
        try:
            for entry in pending(api, args.node):
                handle(api, args, entry)
        except (urllib.error.URLError, OSError) as err:
            log(f"server unreachable: {err}")
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
