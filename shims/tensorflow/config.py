"""tf.config: the GPU and TensorFlow's allocator numbers."""

import vramlab_shim as _vs


class _Device:
    def __init__(self, name, device_type):
        self.name, self.device_type = name, device_type

    def __repr__(self):
        return "PhysicalDevice(name='%s', device_type='%s')" % (self.name, self.device_type)


def list_physical_devices(kind=None):
    return [_Device("/physical_device:GPU:0", "GPU")] if kind in (None, "GPU") else []


class experimental:
    @staticmethod
    def get_memory_info(device):
        s = _vs.stats()
        return {"current": s["allocated_bytes"], "peak": s["peak_allocated_bytes"]}

    @staticmethod
    def reset_memory_stats(device):
        _vs.run(_vs.command("reset_peak_memory_stats"))

    @staticmethod
    def set_memory_growth(device, enable):
        _vs.note("set_memory_growth: choose allow_growth in the kernel's settings (it applies at restart)")
