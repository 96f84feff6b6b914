"""Deployment tooling: model export (ONNX, TensorRT), capacity benchmarks and service
packaging. Holds no core logic.
"""
