#!/usr/bin/env python3
"""The device kit's decisions that a dry run cannot reach (it has no GPU, so
test_cuda_backend skips): when cuDNN's attention failed its checks, the
later steps must run the flash kernels and the table must say why; when it
passed, or never ran, nothing changes. And how ncu's kernel names group
into the profile's families, cuDNN's among them."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_kit  # noqa: E402


class FakeKit:
    def __init__(self):
        self.env = {"MEGA_CUDA_MODULE": "x"}
        self.rows = []

    def row(self, step, what, verdict, detail=""):
        self.rows.append((step, what, verdict, detail))


FLASH_OK = ["ok   flash attention B2 T200 NH4 G2 hs64 (largest error 0.0031, allowed 0.01)"]
START, DONE = "# cuDNN attention cases", "# cuDNN attention cases done"
GUARD_OK = ["ok   attention refuses buffers sized for flash attention"]


class CudnnVerdict(unittest.TestCase):
    def test_failed_check_turns_cudnn_off(self):
        k = FakeKit()
        bad = "FAIL cuDNN attention B2 T200 NH4 G2 hs64[7]: cuda 0, cpu 0.25"
        gpu_kit.cudnn_verdict(k, FLASH_OK + [START, bad, DONE] + GUARD_OK, "FAIL")
        self.assertEqual(k.env["MEGA_CUDNN_ATTENTION"], "off")
        self.assertEqual(len(k.rows), 1)
        self.assertIn("cuDNN attention B2 T200", k.rows[0][3])

    def test_death_inside_the_cudnn_cases_turns_it_off(self):
        k = FakeKit()
        lines = FLASH_OK + [START, "ok   cuDNN attention B2 T200 NH4 G2 hs64"]
        gpu_kit.cudnn_verdict(k, lines, "FAIL")
        self.assertEqual(k.env["MEGA_CUDNN_ATTENTION"], "off")
        self.assertIn("died in its cuDNN cases", k.rows[0][3])

    def test_passing_leaves_it_on(self):
        k = FakeKit()
        lines = FLASH_OK + [START, "ok   cuDNN attention B1 T1024 NH12 G12 hs64", DONE]
        gpu_kit.cudnn_verdict(k, lines, "ok")
        self.assertNotIn("MEGA_CUDNN_ATTENTION", k.env)
        self.assertEqual(k.rows, [])

    def test_other_failures_are_not_cudnns(self):
        # cuDNN absent (skipped) and a flash check failing: the flash
        # failure is the suite's row, not a reason to change the later steps
        k = FakeKit()
        lines = ["FAIL flash attention B2 T200 NH4 G2 hs64[3]: cuda 1, cpu 2",
                 "skipped cuDNN attention: CUDA 13.0, no cuDNN (libcudnn.so.9 is not there)"]
        gpu_kit.cudnn_verdict(k, lines, "FAIL")
        self.assertNotIn("MEGA_CUDNN_ATTENTION", k.env)


    def test_death_after_the_cases_is_not_cudnns(self):
        # the cases done, then a later check fails to set up or dies
        k = FakeKit()
        lines = FLASH_OK + [START, "ok   cuDNN attention B2 T200 NH4 G2 hs64", DONE,
                            "FAIL alloc: out of memory"]
        gpu_kit.cudnn_verdict(k, lines, "FAIL")
        self.assertNotIn("MEGA_CUDNN_ATTENTION", k.env)

    def test_failures_outside_the_cases_are_not_cudnns(self):
        # attention dropout's refusal names cuDNN ("the flash kernels and
        # cuDNN draw no dropout mask"), but its checks run the batched GEMMs
        # after the cuDNN cases: cuDNN's attention stays on for the bench
        k = FakeKit()
        guard = ("FAIL attention sizes guard with a mask: full 32768, flash 16640, status 2: "
                 "cuda backend: attention dropout runs the batched GEMMs (the flash kernels "
                 "and cuDNN draw no dropout mask), which need 32768 and 49152 floats")
        drop = ("FAIL cuda attention dropout --bf16 B2 T130 NH2 G2 hs64 fused qkv: cuda "
                "backend: attention dropout runs the batched GEMMs (the flash kernels and "
                "cuDNN draw no dropout mask)")
        for before in ([], [drop]):
            lines = before + FLASH_OK + [START, "ok   cuDNN attention B2 T200 NH4 G2 hs64", DONE,
                                         guard]
            gpu_kit.cudnn_verdict(k, lines, "FAIL")
            self.assertNotIn("MEGA_CUDNN_ATTENTION", k.env)
            self.assertEqual(k.rows, [])

    def test_crash_before_any_line_of_the_cases(self):
        k = FakeKit()
        gpu_kit.cudnn_verdict(k, FLASH_OK + [START], "FAIL")
        self.assertEqual(k.env["MEGA_CUDNN_ATTENTION"], "off")


class KernelFamily(unittest.TestCase):
    def test_names(self):
        self.assertEqual(gpu_kit.kernel_family(
            "void mega_cu_xent_fwd<(int)1>(float *, float *, const int *, int, int)"),
            "mega_cu_xent_fwd")
        name = gpu_kit.kernel_family(
            "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_"
            "kernel0_0(cudnn::fusion::FusionParams)")
        self.assertTrue(name.startswith("cudnn_generated_fort_native_sdpa_sm90"))
        self.assertLessEqual(len(name), 60)


if __name__ == "__main__":
    unittest.main()
