"""The floor of rules: pure Python (numpy allowed), no torch.

What an algorithm *is* — its rank grid, route, byte and FLOP counts, block plans, the layouts'
position maths, the masks' geometry, the model's shapes and the memory it predicts — lives here, so
`seqpar.algorithms` executes these rules and `seqpar.planner` predicts from them without
importing torch. Nothing here imports any other part of seqpar but `seqpar.errors`.
"""
