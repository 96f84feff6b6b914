"""The U2++ model: encoder + CTC head + attention decoder, with WeNet's rescoring inputs and loss."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asr_core.model.cmvn import GlobalCMVN
from asr_core.model.config import ModelConfig
from asr_core.model.ctc import CTC
from asr_core.model.decoder import BiTransformerDecoder, TransformerDecoder
from asr_core.model.encoder import U2Encoder
from asr_core.model.label_smoothing import LabelSmoothingLoss


def pad_list(seqs: list[Tensor], pad_value: int) -> Tensor:
    """Stack 1-D int64 tensors into (N, max_len), padding with ``pad_value``."""
    return nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=pad_value)


def add_sos_eos(ys_pad: Tensor, sos: int, eos: int, ignore_id: int) -> tuple[Tensor, Tensor]:
    """ys_pad: (N, S) padded with ignore_id -> (ys_in (N, S+1) = sos + ys, eos padding;
    ys_out (N, S+1) = ys + eos, ignore_id padding), as WeNet."""
    ys = [y[y != ignore_id] for y in ys_pad]
    sos_t = ys_pad.new_tensor([sos])
    eos_t = ys_pad.new_tensor([eos])
    ys_in = pad_list([torch.cat((sos_t, y)) for y in ys], eos)
    ys_out = pad_list([torch.cat((y, eos_t)) for y in ys], ignore_id)
    return ys_in, ys_out


def reverse_pad_list(ys_pad: Tensor, ys_lens: Tensor, pad_value: int) -> Tensor:
    """Reverse each row's first ys_lens[i] tokens: (N, S) -> (N, max(ys_lens))."""
    return pad_list([y[: int(n)].flip(0) for y, n in zip(ys_pad, ys_lens, strict=True)], pad_value)


class ASRModel(nn.Module):
    """``encoder`` (U2Encoder), ``decoder`` (bi/uni-directional), ``ctc`` (CTC head)."""

    def __init__(self, config: ModelConfig, global_cmvn: GlobalCMVN | None) -> None:
        super().__init__()
        vocab = config.output_dim
        d_model = config.encoder_conf.output_size
        special = (config.tokenizer_conf.special_tokens if config.tokenizer_conf else None) or {}
        self.vocab_size = vocab
        self.sos = special.get("<sos>", vocab - 1)
        self.eos = special.get("<eos>", vocab - 1)
        self.blank_id = special.get("<blank>", config.ctc_conf.ctc_blank_id)
        self.ignore_id = config.model_conf.ignore_id
        self.ctc_weight = config.model_conf.ctc_weight
        self.reverse_weight = config.model_conf.reverse_weight
        self.encoder = U2Encoder(config.encoder_conf, config.input_dim, config.encoder, global_cmvn)
        self.decoder: BiTransformerDecoder | TransformerDecoder = (
            BiTransformerDecoder(vocab, d_model, config.decoder_conf)
            if config.decoder == "bitransformer"
            else TransformerDecoder(vocab, d_model, config.decoder_conf, config.decoder_conf.num_blocks)
        )
        self.ctc = CTC(vocab, d_model, self.blank_id)
        self.criterion_att = LabelSmoothingLoss(
            vocab,
            self.ignore_id,
            config.model_conf.lsm_weight,
            config.model_conf.length_normalized_loss,
        )

    def ctc_log_probs(self, ys: Tensor) -> Tensor:
        """ys: (B, T', D) encoder output -> (B, T', V) CTC log-posteriors."""
        return self.ctc.log_softmax(ys)

    def rescoring_inputs(self, hyps: list[list[int]], device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        """n-best token lists -> (hyps_pad (N, max_len+1) = sos + tokens padded with eos,
        hyps_lens (N,) = len + 1), the input of ``forward_attention_decoder``."""
        seqs = [torch.tensor([self.sos, *h], dtype=torch.int64, device=device) for h in hyps]
        lens = torch.tensor([len(s) for s in seqs], dtype=torch.int64, device=device)
        return pad_list(seqs, self.eos), lens

    def forward_attention_decoder(
        self,
        hyps_pad: Tensor,
        hyps_lens: Tensor,
        encoder_out: Tensor,
        reverse_weight: float = 0.0,
        encoder_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """WeNet's ``forward_attention_decoder``: decoder log-probs for n-best hypotheses.

        hyps_pad: (N, L) sos + tokens, eos padding (see ``rescoring_inputs``);
        hyps_lens: (N,) lengths INCLUDING sos; encoder_out: (1, T', D) shared by all
        hypotheses (WeNet) or (N, T', D) per hypothesis (batched rescoring of many streams,
        with encoder_mask (N, 1, T') bool for padded frames).
        The right-to-left input is sos + each hypothesis reversed, eos padding.
        Returns (l2r (N, L, V), r2l (N, L, V); empty when reverse_weight is 0).
        """
        n = hyps_pad.size(0)
        if encoder_out.size(0) == 1 and n > 1:
            encoder_out = encoder_out.expand(n, -1, -1)
        if encoder_mask is None:
            encoder_mask = torch.ones(n, 1, encoder_out.size(1), dtype=torch.bool, device=encoder_out.device)
        r_lens = hyps_lens - 1  # (N,) tokens without sos
        max_len = hyps_pad.size(1) - 1
        steps = torch.arange(max_len, device=hyps_pad.device)  # (L-1,)
        valid = r_lens.unsqueeze(1) > steps  # (N, L-1)
        index = ((r_lens.unsqueeze(1) - 1) - steps) * valid
        r_hyps = torch.gather(hyps_pad[:, 1:], 1, index)
        r_hyps = torch.where(valid, r_hyps, self.eos)
        r_hyps = torch.cat((hyps_pad[:, :1], r_hyps), dim=1)  # (N, L)
        return self.decoder(encoder_out, encoder_mask, hyps_pad, hyps_lens, r_hyps, reverse_weight)

    def forward(
        self, speech: Tensor, speech_lengths: Tensor, text: Tensor, text_lengths: Tensor
    ) -> dict[str, Tensor | None]:
        """Training loss, as WeNet's ``ASRModel.forward``.

        speech: (B, T, n_mels) raw fbank; speech_lengths: (B,); text: (B, S) token ids padded
        with ignore_id (-1); text_lengths: (B,).
        Returns {"loss", "loss_ctc", "loss_att"}: loss = w * ctc + (1 - w) * att, where
        att = (1 - r) * l2r + r * r2l label-smoothing losses (w = ctc_weight, r = reverse_weight).
        """
        encoder_out, encoder_mask = self.encoder(speech, speech_lengths)
        encoder_lens = encoder_mask.squeeze(1).sum(1)
        loss_ctc = self.ctc(encoder_out, encoder_lens, text, text_lengths) if self.ctc_weight > 0 else None
        loss_att = None
        if self.ctc_weight < 1.0:
            ys_in, ys_out = add_sos_eos(text, self.sos, self.eos, self.ignore_id)
            r_text = reverse_pad_list(text, text_lengths, self.ignore_id)
            r_ys_in, r_ys_out = add_sos_eos(r_text, self.sos, self.eos, self.ignore_id)
            l2r, r2l = self.decoder(encoder_out, encoder_mask, ys_in, text_lengths + 1, r_ys_in, self.reverse_weight)
            loss_att = self.criterion_att(l2r, ys_out)
            if self.reverse_weight > 0.0:
                loss_att = (1 - self.reverse_weight) * loss_att + self.reverse_weight * self.criterion_att(
                    r2l, r_ys_out
                )
        if loss_ctc is None:
            assert loss_att is not None
            loss = loss_att
        elif loss_att is None:
            loss = loss_ctc
        else:
            loss = self.ctc_weight * loss_ctc + (1 - self.ctc_weight) * loss_att
        return {"loss": loss, "loss_ctc": loss_ctc, "loss_att": loss_att}
