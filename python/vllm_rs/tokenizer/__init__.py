"""The tokenizer of a GGUF model, built from the file's own vocabulary as
transformers builds it (`gguf.py`; Gemma's SentencePiece vocabularies in
`gguf_sentencepiece.py`).
"""
