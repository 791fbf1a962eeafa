# Restart the kernel.
# vramlab python --settings '{"framework":"tensorflow","compute_capability":[8,9],"device_total_bytes":17179869184,"context_bytes":314572800,"allow_growth":false}'
import numpy as np
import tensorflow as tf
