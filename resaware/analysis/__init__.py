"""Analysis: the cross-budget experiment, ONNX Runtime as the reference to match and beat, and figures."""
