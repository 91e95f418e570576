"""All of bertflow's logic, as plain typed functions, in floors that only import downwards:

core -> data -> model -> evaluation -> training -> lifecycle

`pipeline/` (orchestration) sits on top; nothing here imports it, Prefect or DVC.
tests/test_layers.py keeps the floors, the absence of cycles and dvc.yaml's code deps honest.
"""
