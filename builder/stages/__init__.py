"""One module per stage; builder/pipeline.py lists them in order (STAGES) and importing it registers
every stage's variants. Stages never import each other: what they share is in stages/common.py, their
typed results and the build context in stages/base.py.
"""
