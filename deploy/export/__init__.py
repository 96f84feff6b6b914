"""Model export: ONNX graphs of the batched chunk step and the rescoring decoder, INT8
quantization, and ONNX Runtime runners the engine can use instead of torch eager."""
