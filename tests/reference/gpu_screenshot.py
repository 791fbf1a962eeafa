#!/usr/bin/env python3
"""The playground served by `vramlab serve --device cuda`, trained from the
page in headless Chromium, and its screenshot; then the same clicks on
`--device sim`, and the numbers each page showed. Python's standard library
only: Chromium is driven by the DevTools protocol over a pipe
(--remote-debugging-pipe), so nothing but the browser has to be installed.

    python3 tests/reference/gpu_screenshot.py VRAMLAB_BINARY DIST CHROMIUM OUT_DIR

(DEVICES="sim" for only the simulated GPU) writes OUT_DIR/playground-cuda.png, OUT_DIR/playground-sim.png (the whole
page; -screen.png: the first 1280 x 1000 pixels) and prints
JSON: per device, what #device said and the allocated, reserved and peak
bytes after each click.
"""
import base64
import fcntl
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

WIDTH, HEIGHT = 1280, 1000
# Build the page's model, then train it: each click is one command.
CLICKS = ["btn-build", "btn-train-1", "btn-train-1", "btn-train-1", "btn-train-1"]
WAIT_S = 60


class DevTools:
    """One page of a headless Chromium, spoken to over fds 3 and 4."""

    def __init__(self, chromium, profile):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Above 3 and 4, so that placing one cannot overwrite the other.
        low = (to_chrome_r, from_chrome_w)
        to_chrome_r, from_chrome_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in low)
        for fd in low:
            os.close(fd)

        def fds():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        args = [chromium, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--no-zygote",
                "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--font-render-hinting=none", f"--user-data-dir={profile}",
                f"--window-size={WIDTH},{HEIGHT}", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4),
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(profile, "chromium.log"), "w"))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buffer = b""
        self.next_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=WIDTH, height=HEIGHT,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method, session=False, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def read(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def js(self, expression):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)
        return result.get("result", {}).get("value")

    def until(self, expression):
        deadline = time.time() + WAIT_S
        while time.time() < deadline:
            value = self.js(f"(() => {{ try {{ return {expression}; }} catch (e) {{ return null; }} }})()")
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(expression)

    def screenshot(self, path, whole=True):
        height = self.js("document.documentElement.scrollHeight") if whole else HEIGHT
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        self.proc.kill()
        self.proc.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


COUNT = "Number(document.getElementById('result-count').textContent || 0)"
NUMBERS = ("({device: document.getElementById('device').textContent, "
           "allocated: document.getElementById('allocated').dataset.bytes, "
           "reserved: document.getElementById('reserved').dataset.bytes, "
           "peak: document.getElementById('peak').dataset.bytes})")


def play(binary, dist, chromium, device, png):
    port = free_port()
    server = subprocess.Popen([binary, "serve", "--device", device, "--dist", dist, "--addr", f"127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    profile = tempfile.mkdtemp(prefix="vramlab-chromium-")
    page = None
    try:
        deadline = time.time() + WAIT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError(f"vramlab serve --device {device} did not start: "
                                       f"{server.stderr.read().decode() if server.poll() is not None else ''}")
                time.sleep(0.1)
        page = DevTools(chromium, profile)
        page.call("Page.navigate", session=True, url=f"http://127.0.0.1:{port}/")
        page.until("document.getElementById('status').textContent === 'connected'")
        steps = []
        for button in CLICKS:
            before = page.js(COUNT)
            page.js(f"document.getElementById('{button}').click()")
            page.until(f"{COUNT} > {before}")
            steps.append({"click": button, **page.js(NUMBERS)})
        page.screenshot(png)
        page.screenshot(png.replace(".png", "-screen.png"), whole=False)
        return {"device": device, "steps": steps}
    finally:
        if page:
            page.close()
        server.terminate()
        server.wait()


def main():
    binary, dist, chromium, out = sys.argv[1:5]
    os.makedirs(out, exist_ok=True)
    runs = [play(binary, dist, chromium, device, os.path.join(out, f"playground-{device}.png"))
            for device in os.environ.get("DEVICES", "cuda sim").split()]
    print(json.dumps({"clicks": CLICKS, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
