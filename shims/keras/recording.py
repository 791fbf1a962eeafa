"""Whether a tf.GradientTape records: the tapes open now. TensorFlow's
GradientTape enters and leaves them; a Keras model's forward reads them
(it keeps what the gradients need only while one records)."""

open_tapes = []


def recording():
    """A tape is recording: a forward keeps its saved tensors."""
    return bool(open_tapes)
