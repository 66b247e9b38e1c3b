"""The frontend: an ONNX model imported into Relax, the zoo, the convolutions' layout and Winograd
form, the tuning tasks MetaSchedule extracts, and plans of tasks recorded for tuning elsewhere."""
