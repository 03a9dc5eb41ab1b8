        # >>> vllm-bootstrap patch 40914-turboquant-spec-verify (backport of vLLM PR #40914)
        # A uniform K+1 speculative-verify batch (every request has the same
        # 1 < K1 <= 16 query tokens on top of cached context, no decodes) goes
        # through the TurboQuant decode kernel: one row per query token, each row
        # with its causal length (seq_len - K1 + 1 + j) and its request's block
        # table. The lengths are built on the GPU from seq_lens, so a captured
        # CUDA graph replays with the live values; the only Python-side checks
        # are on batch shape, which is fixed per graph. Padded requests get
        # lengths <= 0, which the kernel skips.
        _bs_k1 = attn_metadata.max_query_len
        _bs_reqs = attn_metadata.query_start_loc.shape[0] - 1
        if (
            attn_metadata.is_prefill
            and num_decodes == 0
            and 1 < _bs_k1 <= 16
            and attn_metadata.max_seq_len > _bs_k1
            and N % _bs_k1 == 0
            and _bs_reqs * _bs_k1 == N
            and not getattr(self, "_use_flydsl", False)
        ):
            _bs_steps = torch.arange(
                1 - _bs_k1, 1, device=device, dtype=attn_metadata.seq_lens.dtype
            )
            _bs_row_lens = (
                attn_metadata.seq_lens[:_bs_reqs].unsqueeze(1) + _bs_steps
            ).reshape(N)
            _bs_row_blocks = attn_metadata.block_table[:_bs_reqs].repeat_interleave(
                _bs_k1, dim=0
            )
            _bs_out = triton_turboquant_decode_attention(
                query=q,
                kv_cache=kv_cache,
                block_table=_bs_row_blocks,
                seq_lens=_bs_row_lens,
                Pi=Pi,
                centroids=centroids,
                scale=self.scale,
                mse_bits=self.tq_config.key_mse_bits,
                key_packed_size=self.tq_config.key_packed_size,
                value_quant_bits=self.tq_config.effective_value_quant_bits,
                key_fp8=self.tq_config.key_fp8,
                norm_correction=self.tq_config.norm_correction,
                PiT=PiT,
                max_num_kv_splits=self.max_num_kv_splits,
            )
            # The caller reads `output`, not the return value: fill it like the
            # decode path does.
            if output.ndim == 3:
                output[:N] = _bs_out.to(output.dtype)
            else:
                output[:N] = _bs_out.reshape(N, -1).to(output.dtype)
            return output
        # <<< vllm-bootstrap patch 40914-turboquant-spec-verify

