import torch  # noqa: F401

config = {"lr": 0.1}
print("starting")
print(config["learning_rate"])
