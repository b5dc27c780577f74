"""Training-time compression helpers: structured pruning (prune.py), knowledge distillation
(distill.py), quantisation-aware training (qat.py), and the budgeted, seeded fine-tuning loop they
share (train.py).

Plain helpers of stage ``compress`` (builder/stages/compress.py), the only stage that trains; no
other stage imports them. They take a torch module and a ``TrainingData`` and return a module;
exporting and verifying are the stage's business.
"""
