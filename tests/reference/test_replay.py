"""The replay logic, with a fake framework standing in for PyTorch/JAX:
`python3 -m unittest discover tests/reference`."""
import io
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import replay  # noqa: E402


class Tensor:
    """Frees its bytes when the last reference goes, as a CUDA tensor does."""

    def __init__(self, fake, n):
        self.fake, self.n = fake, n
        fake.allocated += n

    def __del__(self):
        self.fake.allocated -= self.n


class Fake(replay.Framework):
    def __init__(self, limit=1000):
        self.allocated, self.limit = 0, limit

    def alloc(self, cmd):
        if self.allocated + cmd["bytes"] > self.limit:
            raise MemoryError("out of memory")
        return Tensor(self, cmd["bytes"])

    def stats(self):
        return {"allocated_bytes": self.allocated}

    def out_of_memory(self, error):
        return isinstance(error, MemoryError)


def play(lines, framework=None):
    out = io.StringIO()
    replay.play(framework or Fake(), 0, [json.dumps(l) for l in lines], out)
    return [json.loads(l) for l in out.getvalue().splitlines()]


class Workspaces(Fake):
    def __init__(self):
        super().__init__()
        self.cleared = 0

    def clear_cublas_workspaces(self):
        self.cleared += 1


class ReplayTest(unittest.TestCase):
    def test_clearing_cublas_workspaces_reaches_the_framework(self):
        fake = Workspaces()
        r = play([{"cmd": "clear_cublas_workspaces"}, {"cmd": "clear_cublas_workspaces"}], fake)
        self.assertEqual([s["ok"] for s in r], [True, True])
        self.assertEqual(fake.cleared, 2)

    def test_del_frees_only_the_last_reference_and_gc_breaks_cycles(self):
        r = play([
            {"cmd": "alloc", "name": "x", "bytes": 100},
            {"cmd": "hold", "name": "h", "items": ["x"], "cycle": True},
            {"cmd": "del", "name": "x"},
            {"cmd": "del", "name": "h"},
            {"cmd": "gc"},
        ])
        self.assertEqual([s["stats"]["allocated_bytes"] for s in r], [100, 100, 100, 100, 0])

    def test_errors_are_records_and_the_run_goes_on(self):
        r = play([
            {"cmd": "del", "name": "ghost"},
            {"cmd": "hold", "name": "h", "items": ["nope"]},
            {"cmd": "alloc", "name": "x", "bytes": 5000},
            {"cmd": "train", "model": "m"},
            {"cmd": "alloc", "name": "x", "bytes": 10, "say": "annotations are dropped"},
        ])
        self.assertEqual(r[0]["error"], {"kind": "name_error", "message": "name 'ghost' is not defined"})
        self.assertEqual(r[1]["error"]["message"], "name 'nope' is not defined")
        self.assertEqual(r[2]["error"]["kind"], "out_of_memory")
        self.assertEqual(r[3]["error"]["kind"], "unsupported")
        self.assertTrue(r[4]["ok"])
        self.assertNotIn("say", r[4]["cmd"])
        self.assertEqual([x["step"] for x in r], [0, 1, 2, 3, 4])

    def test_restarts_split_the_file_into_processes_with_settings(self):
        lines = [json.dumps(l) + "\n" for l in [
            {"cmd": "restart", "framework": "pytorch", "max_split_size_mb": 64},
            {"cmd": "alloc", "name": "x", "bytes": 1},
            {"cmd": "restart", "no_caching": True},
            {"cmd": "gc"},
        ]]
        parts = replay.segments(lines)
        self.assertEqual([(s, len(l)) for s, l, _ in parts], [(0, 2), (2, 2)])
        self.assertEqual(parts[1][2], {"framework": "pytorch", "max_split_size_mb": 64, "no_caching": True})
        no_restart = replay.segments([json.dumps({"cmd": "gc"})])
        self.assertEqual(no_restart[0][0], 0)

    def test_the_scripts_turn_settings_into_environment_variables(self):
        import replay_jax
        import replay_pytorch

        env = replay_pytorch.environment({}, {"max_split_size_mb": 64, "no_caching": True})
        self.assertEqual(env["PYTORCH_CUDA_ALLOC_CONF"], "max_split_size_mb:64")
        self.assertEqual(env["PYTORCH_NO_CUDA_MEMORY_CACHING"], "1")
        self.assertEqual(replay_jax.environment({}, {})["XLA_PYTHON_CLIENT_PREALLOCATE"], "false")


if __name__ == "__main__":
    unittest.main()
