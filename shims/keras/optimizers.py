class Optimizer:
    kind = "sgd"

    def __init__(self, learning_rate=None, momentum=0.0, **_):
        self.learning_rate = learning_rate
        if self.kind == "sgd" and momentum:
            self.kind = "momentum"


class SGD(Optimizer):
    kind = "sgd"


class Adam(Optimizer):
    kind = "adam"


class AdamW(Optimizer):
    kind = "adamw"
