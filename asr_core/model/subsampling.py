"""Conv2d input layers: 4x, 6x or 8x time subsampling (WeNet ``Conv2dSubsampling*``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Conv2dSubsampling(nn.Module):
    """Stacked stride-2/3 Conv2d + ReLU, flatten (channels x freq), Linear to d_model.

    State-dict names as WeNet: ``conv.{0,2,4}`` and ``out.0`` (4x) or ``linear`` (6x, 8x).
    """

    def __init__(self, idim: int, odim: int, rate: int) -> None:
        super().__init__()
        if rate == 4:
            kernels = [(3, 2), (3, 2)]
            self.right_context = 6
        elif rate == 6:
            kernels = [(3, 2), (5, 3)]
            self.right_context = 10
        elif rate == 8:
            kernels = [(3, 2), (3, 2), (3, 2)]
            self.right_context = 14
        else:
            raise ValueError(f"subsampling rate {rate} not supported; allowed: 4, 6, 8")
        self.subsampling_rate = rate
        # Channels-last conv weights make oneDNN (and cuDNN) run the whole stack channels-last:
        # on CPU the 1-channel first conv is ~10x and the stack ~2x faster than NCHW. The layout
        # survives load_state_dict (copy_) and .to(); values and state-dict names are WeNet's.
        # (.to, not .contiguous: a 1-input-channel weight counts as both layouts for the latter.)
        layers: list[nn.Module] = []
        freq = idim
        for i, (kernel, stride) in enumerate(kernels):
            conv = nn.Conv2d(1 if i == 0 else odim, odim, kernel, stride)
            conv.weight = nn.Parameter(conv.weight.detach().to(memory_format=torch.channels_last))
            layers += [conv, nn.ReLU(inplace=True)]
            freq = (freq - kernel) // stride + 1
        self.kernels = kernels
        self.conv = nn.Sequential(*layers)
        linear = nn.Linear(odim * freq, odim)
        if rate == 4:
            self.out = nn.Sequential(linear)
        else:
            self.linear = linear
        self.features_channels_last = False
        """The output Linear takes each frame's features frequency-major (``channels_last_features``)."""

    def output_length(self, t_in: int) -> int:
        """Encoder frames produced from ``t_in`` fbank frames."""
        for kernel, stride in self.kernels:
            t_in = (t_in - kernel) // stride + 1
        return t_in

    def subsample_mask(self, mask: Tensor) -> Tensor:
        """mask: (B, 1, T) -> (B, 1, T_out), keeping the frames WeNet keeps."""
        for kernel, stride in self.kernels:
            mask = mask[:, :, kernel - 1 :: stride]
        return mask

    @property
    def output_linear(self) -> nn.Module:
        """The Linear from the flattened conv features to d_model (``out.0`` or ``linear``)."""
        return self.out[0] if self.subsampling_rate == 4 else self.linear

    def channels_last_features(self) -> None:
        """Reorder the output Linear's input columns (in place) to take each frame's conv
        features frequency-major, (F_out, channels), instead of WeNet's (channels, F_out).

        The convs run channels-last, so their output in memory is already (B, T_out, F_out,
        channels): flattened in this order it needs no copy, where WeNet's order transposes it
        (AISHELL size, 32 streams: 0.6 ms of a torch-int8 step). For a copy of the model that a
        backend runs (the state dict's weight is no longer WeNet's); call before quantizing.
        """
        if self.features_channels_last:
            return
        linear = self.output_linear
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"reorder the features before quantizing; the output layer is {type(linear).__name__}")
        odim = linear.out_features  # also the convs' channels
        with torch.no_grad():
            weight = linear.weight.view(odim, odim, -1).transpose(1, 2)  # (odim, F_out, channels)
            linear.weight.copy_(weight.reshape(odim, -1).clone())
        self.features_channels_last = True

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, idim) -> (B, T_out, odim), before position encoding."""
        x = self.conv(x.unsqueeze(1))  # (B, odim, T_out, F_out)
        b, c, t, f = x.size()
        if self.features_channels_last:
            x = x.permute(0, 2, 3, 1).reshape(b, t, f * c)
        else:
            x = x.transpose(1, 2).reshape(b, t, c * f)
        return self.output_linear(x)
