"""Tier stats, promotion and swap against a daemon with a host tier."""
import numpy as np
import pytest

import kvshare
from conftest import SMALL


def test_swap_needs_a_tier(client):
    client.lookup(1, [1, 2, 3, 4, 5])
    client.allocate(1, 5)
    client.commit(1, 0, n=5)
    with pytest.raises(kvshare.NotSupportedError) as ei:
        client.swap_out(1)
    assert ei.value.status == kvshare.ENOTSUP and ei.value.message
    assert client.tier_stats() == ((), 0)
    client.free(1)


def test_swap_out_and_in_keeps_the_bytes(daemon_factory):
    d = daemon_factory(SMALL + ["--host-tier-bytes", "1M"])
    with kvshare.Client(d.socket) as c:
        L = c.layout
        tiers, lost = c.tier_stats()
        assert [t.name for t in tiers] == ["host"] and lost == 0
        assert tiers[0].capacity_bytes == 1 << 20
        c.set_promote(False)
        c.set_promote(True)
        toks = list(range(300, 300 + 2 * L.block_size + 2))  # 2 full + partial
        c.lookup(1, toks)
        a = c.allocate(1, len(toks))
        rng = np.random.default_rng(1)
        want = []
        for b in a.blocks:
            v = rng.normal(size=L.block_shape).astype(np.float32)
            c.block_array(b)[...] = v
            want.append(v)
        c.commit(1, 0, n=len(toks))
        out = c.swap_out(1)
        assert out.tokens == len(toks)
        assert c.stats().swap.swapped_requests == 1
        with pytest.raises(kvshare.StateError):
            c.append(1, 1)  # a swapped-out request takes swap_in/free only
        # Scribble over every free block, so the bytes must come from below.
        for b in range(L.num_blocks):
            if b not in a.blocks[:2]:  # the sealed ones may stay cached
                c.block_array(b)[...] = -1
        back = c.swap_in(1)
        assert back.tokens == len(toks) and back.lost_tokens == 0
        assert len(back.blocks) == len(a.blocks)
        for b, v in zip(back.blocks, want):
            got = c.block_array(b)
            # The partial block holds 2 written tokens: compare those.
            assert np.array_equal(got[:, :, :2], v[:, :, :2])
        st = c.stats()
        assert st.swap.swap_outs == 1 and st.swap.swap_ins == 1
        assert st.swap.swapped_requests == 0
        c.append(1, 1)
        c.free(1)
