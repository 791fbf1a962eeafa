# Restart the kernel.
# vramlab python --settings '{"framework":"tensorflow","allow_growth":true}'
import numpy as np
import tensorflow as tf
