// SPDX-License-Identifier: GPL-2.0
/*
 * hpnlab ECN marking stage for switch egress ports (tc clsact egress, direct action).
 *
 * Each port (keyed by ifindex) keeps a *virtual queue*: bytes that arrive are added, and
 * the queue drains at the port's shaped rate (the htb rate of the same interface), so it
 * tracks the backlog of the real htb queue behind this hook. An ECT packet (ECN bits 01
 * or 10) that finds the backlog above Kmin is marked CE with probability
 *   p = Pmax * (q - Kmin) / (Kmax - Kmin)   for Kmin < q < Kmax,   and always at q >= Kmax
 * (the RED/DCQCN marking profile). Thresholds live in hpn_ecn_cfg and can be changed at
 * any time from user space; counters live in hpn_ecn_state. Non-IPv4 packets are counted
 * into the queue but never touched. The program never drops: it returns TC_ACT_OK.
 *
 * The queue's peak per PEAK_SLOT_NS slot of the monotonic clock, over the last PEAK_SLOTS
 * slots: slot_id[i] names the slot (ktime / PEAK_SLOT_NS, low 32 bits) whose peak slot_peak[i]
 * holds, so any number of readers take the peak over their own interval without resetting
 * anything (a burst between two reads is seen, not only the backlog the last packet found).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <stddef.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct ecn_cfg {
	__u64 rate_bps;   /* drain rate in bytes per second */
	__u32 kmin;       /* bytes */
	__u32 kmax;       /* bytes */
	__u32 pmax;       /* marking probability at Kmax, as a fraction of 2^32 - 1 */
	__u32 limit;      /* bytes: the port buffer; the virtual queue never exceeds it */
	__u32 enabled;    /* 0: count only, never mark */
	__u32 pad;
};

#define PEAK_SLOTS 64
#define PEAK_SLOT_NS 10000000ULL   /* 10 ms: the ring covers the last 640 ms */

struct ecn_state {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 queue;      /* virtual queue, bytes */
	__u64 last_ns;
	__u64 bytes;
	__u64 packets;
	__u64 ect;        /* ECT(0)/ECT(1) packets seen */
	__u64 ce_marked;  /* packets this stage marked CE */
	__u64 ce_seen;    /* packets that arrived already marked CE */
	__u64 max_queue;
	__u32 slot_id[PEAK_SLOTS];
	__u32 slot_peak[PEAK_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct ecn_cfg);
} hpn_ecn_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct ecn_state);
} hpn_ecn_state SEC(".maps");

#define TOS_OFF (ETH_HLEN + offsetof(struct iphdr, tos))
#define CSUM_OFF (ETH_HLEN + offsetof(struct iphdr, check))

SEC("tc")
int hpn_ecn(struct __sk_buff *skb)
{
	__u32 key = skb->ifindex;
	struct ecn_cfg *cfg = bpf_map_lookup_elem(&hpn_ecn_cfg, &key);
	struct ecn_state *st = bpf_map_lookup_elem(&hpn_ecn_state, &key);
	__u64 now = bpf_ktime_get_ns();
	__u32 rnd = bpf_get_prandom_u32();
	__u32 len = skb->len;
	__u8 tos = 0;
	int ip4 = 0, mark = 0;

	if (!cfg || !st)
		return TC_ACT_OK;
	if (skb->protocol == bpf_htons(ETH_P_IP) && bpf_skb_load_bytes(skb, TOS_OFF, &tos, 1) == 0)
		ip4 = 1;

	__u64 rate = cfg->rate_bps, kmin = cfg->kmin, kmax = cfg->kmax, pmax = cfg->pmax;
	__u64 limit = cfg->limit;
	int enabled = cfg->enabled;

	bpf_spin_lock(&st->lock);
	__u64 elapsed = now - st->last_ns;
	__u64 q = st->queue;
	if (st->last_ns == 0 || elapsed >= 1000000000ULL) {
		q = 0;
	} else {
		__u64 drained = elapsed * rate / 1000000000ULL;
		q = q > drained ? q - drained : 0;
	}
	/* the packet joins a backlog of q bytes */
	if (ip4 && (tos & 3) && (tos & 3) != 3 && enabled && q > kmin) {
		if (q >= kmax || kmax <= kmin)
			mark = 1;
		else if ((__u64)rnd < pmax * (q - kmin) / (kmax - kmin))
			mark = 1;
	}
	q += len;
	if (limit && q > limit)
		q = limit;
	st->queue = q;
	st->last_ns = now;
	st->bytes += len;
	st->packets += 1;
	if (ip4 && (tos & 3) == 3)
		st->ce_seen += 1;
	else if (ip4 && (tos & 3))
		st->ect += 1;
	if (mark)
		st->ce_marked += 1;
	if (q > st->max_queue)
		st->max_queue = q;
	__u64 slot = now / PEAK_SLOT_NS;
	__u32 i = (__u32)slot & (PEAK_SLOTS - 1);
	if (st->slot_id[i] != (__u32)slot) {
		st->slot_id[i] = (__u32)slot;
		st->slot_peak[i] = 0;
	}
	if (q > st->slot_peak[i])
		st->slot_peak[i] = (__u32)q;
	bpf_spin_unlock(&st->lock);

	if (mark) {
		__u8 newtos = tos | 3;
		bpf_l3_csum_replace(skb, CSUM_OFF, bpf_htons((__u16)tos), bpf_htons((__u16)newtos), 2);
		bpf_skb_store_bytes(skb, TOS_OFF, &newtos, 1, 0);
	}
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
