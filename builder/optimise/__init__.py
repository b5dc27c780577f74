"""Graph tools and optimisers: pure functions the stages call (they never import a stage).

- onnx_tools.py: ONNX load/save with external data, onnxruntime offline optimisation, onnxoptimizer and
  onnxslim passes, FP16 conversion
- onnx_quantize.py: onnxruntime's quantisation calls (static with a recipe, dynamic)
- quant_search.py: the bounded search for the static INT8 recipe to publish on this host
- transformer_fusion.py: onnxruntime's transformer optimizer for encoders (Attention, SkipLayerNorm ...)
- openvino_tools.py: ONNX -> IR, the in-process runner, NNCF INT8
- torch_fp16.py: an FP16 TorchScript from an FP32 one; trace_safety.py: which control flow a trace froze
"""
