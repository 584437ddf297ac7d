"""Integrations of fusedattn into frameworks, each imported on its own (its framework is then
needed; `import fusedattn` never imports them):

    import fusedattn.integrations.transformers   # attn_implementation="fusedattn" in transformers
"""
