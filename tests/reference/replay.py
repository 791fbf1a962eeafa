"""What the replay scripts share: splitting a command file at restarts (each
restart is a fresh process, as restarting a kernel is), and playing the tensor
commands on a framework, printing `vramlab run`'s records."""
import gc
import json
import os
import subprocess
import sys

ANNOTATIONS = ("say", "why", "expect")


def commands(lines):
    """The commands of the lines, without lesson annotations."""
    return [{k: v for k, v in json.loads(l).items() if k not in ANNOTATIONS} for l in lines if l.strip()]


def segments(lines):
    """(first step, lines, settings so far) for each process: a new one at
    every restart; restart settings accumulate as in `vramlab run`."""
    lines = [l for l in lines if l.strip()]
    settings, out, current, start = {}, [], [], 0
    for i, cmd in enumerate(commands(lines)):
        if cmd.get("cmd") == "restart":
            if current:
                out.append((start, current, dict(settings)))
            settings.update({k: v for k, v in cmd.items() if k != "cmd"})
            current, start = [], i
        current.append(lines[i])
    if current:
        out.append((start, current, dict(settings)))
    return out


def drive(script, path, environment):
    """Runs each segment of the file in a fresh `script --process` and
    prints what they print."""
    with open(path) as f:
        parts = segments(f.readlines())
    for start, lines, settings in parts:
        proc = subprocess.run([sys.executable, script, "--process", str(start), json.dumps(settings)],
                              input="".join(lines), text=True, capture_output=True,
                              env=environment(dict(os.environ), settings))
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            sys.exit(proc.returncode)


def gpu_total_bytes():
    """The real GPU's memory in bytes as CUDA reports it (cudaMemGetInfo's
    total, which frameworks scale their fractions by; NVML's is larger by
    what the driver keeps), asked once of a PyTorch process, or None
    without a GPU."""
    if "VRAMLAB_GPU_TOTAL_BYTES" not in os.environ:
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.mem_get_info()[1])"],
                               capture_output=True, text=True)
        os.environ["VRAMLAB_GPU_TOTAL_BYTES"] = probe.stdout.strip() if probe.returncode == 0 else ""
    total = os.environ["VRAMLAB_GPU_TOTAL_BYTES"]
    return int(total) if total else None


class Framework:
    """One framework's side of a replay."""

    def alloc(self, cmd):
        raise NotImplementedError

    def empty_cache(self):
        pass

    def clear_cublas_workspaces(self):
        pass

    def reset_peaks(self):
        pass

    def stats(self):
        raise NotImplementedError

    def out_of_memory(self, error):
        """Whether an exception is the framework's OOM."""
        raise NotImplementedError


def play(framework, start, lines, out=sys.stdout):
    """Plays the commands of one process and prints a record per command.
    CPython's automatic collection is off: it runs when the count of
    container objects made passes 700, so its moments depend on this
    script's own objects; a file's `gc` is the only collection, as in
    `vramlab run`."""
    gc.disable()
    names = {}
    for i, cmd in enumerate(commands(lines)):
        kind = cmd.get("cmd")
        record = {"step": start + i, "cmd": cmd, "ok": True}
        try:
            if kind == "restart":
                pass  # this process is the restarted kernel
            elif kind == "alloc":
                names[cmd["name"]] = framework.alloc(cmd)
            elif kind == "del":
                if cmd["name"] not in names:
                    raise NameError(f"name '{cmd['name']}' is not defined")
                del names[cmd["name"]]
            elif kind == "hold":
                missing = [n for n in cmd["items"] if n not in names]
                if missing:
                    raise NameError(f"name '{missing[0]}' is not defined")
                h = [names[n] for n in cmd["items"]]
                if cmd.get("cycle"):
                    h.append(h)
                names[cmd["name"]] = h
                del h
            elif kind == "gc":
                gc.collect()
            elif kind == "empty_cache":
                framework.empty_cache()
            elif kind == "clear_cublas_workspaces":
                framework.clear_cublas_workspaces()
            elif kind == "reset_peak_memory_stats":
                framework.reset_peaks()
            else:
                record["ok"] = False
                record["error"] = {"kind": "unsupported", "message": f"{kind} is not replayed"}
        except NameError as e:
            record["ok"] = False
            record["error"] = {"kind": "name_error", "message": str(e)}
        except Exception as e:  # noqa: BLE001 - only the framework's OOM is expected
            if not framework.out_of_memory(e):
                raise
            record["ok"] = False
            record["error"] = {"kind": "out_of_memory", "message": str(e)}
        record["stats"] = framework.stats()
        print(json.dumps(record), file=out, flush=True)
