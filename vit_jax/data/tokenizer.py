"""Text to the text tower's token ids, with a SentencePiece model: SigLIP's
and SigLIP 2's (Gemma's) as their checkpoints ship them, or one trained
here on a dataset's captions (`train`).

A text becomes its pieces' ids and the end-of-text id, cut to `length`
and padded with the end-of-text id (SigLIP's "sticky EOS": the text tower
pools the last token, which is then always one). Models are read and
written through the path layer: a model file may be a URL.
"""

import io

import numpy as np

from vit_jax import errors, paths

# The ids a model trained here reserves (SigLIP's c4 model's): padding,
# end of text, unknown; no beginning-of-text id.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def _sentencepiece():
  import sentencepiece  # pylint: disable=g-import-not-at-top
  return sentencepiece


class Tokenizer:
  """A SentencePiece model (its serialised bytes) and the length texts are
  padded or cut to."""

  def __init__(self, model_proto, length):
    self.processor = _sentencepiece().SentencePieceProcessor(
        model_proto=model_proto)
    self.length = length
    self.eos_id = self.processor.eos_id()
    if self.eos_id < 0:
      raise errors.InputError("the tokenizer has no end-of-text piece, "
                              "which the text tower pools")

  @classmethod
  def read(cls, path, length):
    try:
      data = paths.path(path).read_bytes()
    except FileNotFoundError:
      raise errors.InputError(f"{paths.shown(path)}: no such tokenizer "
                              "(a SentencePiece .model file)") from None
    try:
      return cls(data, length)
    except RuntimeError:
      raise errors.InputError(f"{paths.shown(path)}: not a SentencePiece "
                              "model") from None

  @property
  def vocab_size(self):
    return self.processor.get_piece_size()

  def encode(self, texts):
    """int32 [len(texts), length]: each text's ids, the end-of-text id,
    then end-of-text ids to the length; a text too long is cut, keeping
    its last id the end-of-text id."""
    ids = np.full((len(texts), self.length), self.eos_id, np.int32)
    for row, pieces in enumerate(self.processor.encode(list(texts))):
      pieces = pieces[:self.length - 1]
      ids[row, :len(pieces)] = pieces
    return ids


  def encode_bytes(self, texts):
    """`encode` of UTF-8 texts as bytes (numpy's, TensorFlow's strings):
    what the input pipeline tokenises its captions with."""
    return self.encode([text.decode("utf-8", "replace") for text in texts])


def train(texts, vocab_size):
  """A SentencePiece model (BPE, its bytes) trained on `texts`; the same
  texts give the same model."""
  model = io.BytesIO()
  _sentencepiece().SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model,
      vocab_size=vocab_size, model_type="bpe", character_coverage=1.0,
      pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
      num_threads=1, minloglevel=2)
  return model.getvalue()
