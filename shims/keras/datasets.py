"""Keras's datasets as arrays of their shapes (on the host)."""

import numpy as np


class mnist:
    @staticmethod
    def load_data():
        return (np.zeros((60000, 28, 28), "uint8"), np.zeros((60000,), "uint8")), (
            np.zeros((10000, 28, 28), "uint8"),
            np.zeros((10000,), "uint8"),
        )


fashion_mnist = mnist
