"""The GPU check skips a lesson whose Python needs a package the machine
lacks (vLLM for lesson 22), and runs the others."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import lesson_python_gpu  # noqa: E402


class SkipReason(unittest.TestCase):
    def test_a_lesson_without_vllm_is_not_asked_for_it(self):
        reason = lesson_python_gpu.skip_reason("x = 1\n", {"framework": "pytorch"})
        self.assertTrue(reason is None or reason.startswith("torch "), reason)

    def test_vllm_is_asked_for_only_where_imported(self):
        source = "from vllm import LLM\n"
        try:
            import vllm  # noqa: F401
            have = True
        except Exception:
            have = False
        torch_ok = lesson_python_gpu.skip_reason("x = 1\n", {"framework": "pytorch"}) is None
        reason = lesson_python_gpu.skip_reason(source, {"framework": "pytorch"})
        if torch_ok and not have:
            self.assertTrue(reason.startswith("vllm is not installed here"), reason)
        if not torch_ok:
            self.assertTrue(reason.startswith("torch is not installed here"), reason)


if __name__ == "__main__":
    unittest.main()
