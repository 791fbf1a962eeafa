class _Scheduler:
    def __init__(self, optimizer, *a, **k):
        self.optimizer = optimizer

    def step(self, *a):
        pass


StepLR = CosineAnnealingLR = LambdaLR = ExponentialLR = OneCycleLR = ReduceLROnPlateau = _Scheduler
