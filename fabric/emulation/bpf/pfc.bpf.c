// SPDX-License-Identifier: GPL-2.0
/*
 * hpnlab lossless switching: the shared switch buffer and priority flow control (PFC) in tc BPF,
 * beside any forwarding engine (Open vSwitch's userspace datapath here). The decisions are those
 * of hpnlab.fabric.workload.lossless (HPCC's switch-mmu.cc), which states and tests them in Python;
 * hpnlab.fabric.emulation.pfc loads this object, fills its maps and starts the pause agent
 * (pfc_agent.c), which turns the PAUSE/RESUME events below into gate changes on the upstream
 * transmitter. Keep the structures in step with hpnlab.fabric.emulation.pfc (Python struct formats).
 *
 * Ports. Every switch port and host NIC has a global id (gid). A switch port's gid is its switch's
 * base + its port number. Switch ports live in the root namespace (looked up by ifindex); host NICs
 * in their hosts' namespaces, where ifindexes repeat: they are looked up by their MAC (the Ethernet
 * source of what they send, the destination of what they receive).
 *
 * The tag. Open vSwitch's userspace datapath reads a port through a packet socket before tc ingress
 * runs, so nothing written at ingress reaches it and skb metadata does not cross it: what a packet
 * must carry is written at egress, into the IPv4 ID (16 bits, unused by unfragmented packets):
 *     [ egress gid | egress class (2 bits) | ingress class (2 bits) | ingress port number (kbits) ]
 * written by the transmitter (switch port or host NIC) as the packet leaves it: the class the packet
 * is queued in there, and the class and port number it came into that switch by (3, 0: none).
 *
 * Classes. 0: lossless data (UDP, DSCP 26: RoCEv2 data), 1: lossless bounced (a fast-failover detour
 * marked by the controller's tables, when bounced packets have a priority of their own), 2: lossy
 * (other IPv4), 3: high (DSCP 48: CNPs, ACKs; BFD; anything not IPv4: ARP, LLDP). Each egress
 * class is an htb class (skb->priority) of the port's tree (shaping.py); lossless ones have a gate.
 *
 * A packet is in switch S from its arrival at S's ingress hook until it arrives at the hook at the
 * other end of S's egress link (veths transmit at once: that is when it left S's egress queue).
 *   sw_in   (switch port, tc ingress, read only): depart(tag) from the upstream switch; a lossless
 *           packet is admitted and charged to (ingress port, class) or, its headroom full, doomed
 *           (dropped by sw_out when it gets there: counted); pause above Xoff (ringbuf event).
 *   sw_out  (switch port, tc egress): the packet's class; a doomed packet is dropped; lossy packets
 *           drop-tail at the port's lossy buffer; ECN on the real occupancy of the egress queue;
 *           charged to the egress queue; retagged.
 *   host_out (host NIC, tc egress): the class; tagged.    host_in (host NIC, tc ingress): depart(tag).
 * Nothing is ever dropped at ingress (it would not stop Open vSwitch): drops happen at egress.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <stddef.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define PFC_MAX_PORTS 4096
#define PFC_MAX_SWITCHES 1024
#define PFC_PRIOS 2
#define PFC_CLASSES 3
#define CLS_LOSSY 2
#define CLS_HIGH 3
#define NO_CLASS 3
#define ETH_P_PAUSE 0x8808
#define HTB_MAJOR 0x10000
#define DOOMED_MAX 4096

struct pfc_global {
	__u32 kbits;          /* bits of the ingress port number in a tag */
	__u32 bounce;         /* 1: bounced lossless packets take class 1 */
	__u32 dscp;           /* the lossless DSCP */
	__u32 ecn;            /* 1: mark ECN on the egress queue's real occupancy */
	__u64 marks[2];       /* Ethernet sources of bounced packets (MAC in the low 48 bits, as on the wire) */
	__u32 class_minor[4]; /* htb class minor per class (1:11, 1:13, 1:12, 1:10) */
};

struct pfc_link {
	__u32 peer;           /* gid at the other end of this port's link */
	__u32 sw;             /* switch index + 1 (0: a host NIC) */
	__u32 base;           /* gid of this switch's port 0: ingress gid = base + port number */
	__u32 local;          /* port number on its switch */
	__u32 headroom;       /* bytes per lossless class (switch ports) */
	__u32 lossy_limit;    /* lossy egress buffer (switch ports; 0: none) */
};

struct pfc_swcfg {
	__u64 shared;         /* shared buffer bytes */
	__u32 alpha_q8;       /* dynamic Xoff: alpha in 1/256 (0: static) */
	__u32 xoff;           /* static Xoff */
	__u32 resume;         /* resume offset */
	__u32 reserved;       /* per (ingress port, class) */
};

struct pfc_ingress {
	struct bpf_spin_lock lock;
	__u32 paused;
	__s64 bytes;          /* reserve + shared use */
	__s64 headroom;
	__u64 pauses;
	__u64 resumes;
	__u64 drops;          /* headroom drops */
	__u64 drop_bytes;
	__u64 paused_ns;
	__u64 pause_since;
	__u64 pkts;
	__u64 octets;
	__u32 seq;            /* pause/resume decisions so far (the agent keeps the newest) */
	__u32 pad;
};

struct pfc_egress {
	__s64 bytes[PFC_CLASSES];
	__u64 pkts[PFC_CLASSES];
	__u64 lossy_drops;
	__u64 headroom_drops;
};

struct pfc_switch {
	__s64 shared_used;
};

/* peaks, apart from the live state: user space zeroes them between measurements (a racing maximum
 * may be lost, never a byte of the accounting). By gid; a switch's shared buffer at PFC_MAX_PORTS + index */
struct pfc_peak {
	__s64 ingress;        /* an (ingress port, lossless class)'s bytes, headroom included */
	__s64 headroom;
	__s64 egress[PFC_CLASSES];
	__s64 shared;         /* a switch's shared buffer in use */
	__s64 pause_ns;       /* the longest pause an (ingress port, lossless class) held, from Xoff to resume */
};

struct pfc_event {
	__u64 ts;
	__u32 gid;
	__u16 prio;
	__u16 type;           /* 1 pause, 0 resume */
	__u32 seq;
	__u32 pad;
};

/* the ECN stage's maps and their layout (ecn_marker.bpf.c; tests/unit/test_pfc_plan.py holds them equal) */
struct ecn_cfg {
	__u64 rate_bps;
	__u32 kmin;
	__u32 kmax;
	__u32 pmax;
	__u32 limit;
	__u32 enabled;
	__u32 pad;
};

#define PEAK_SLOTS 64
#define PEAK_SLOT_NS 10000000ULL

struct ecn_state {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 queue;
	__u64 last_ns;
	__u64 bytes;
	__u64 packets;
	__u64 ect;
	__u64 ce_marked;
	__u64 ce_seen;
	__u64 max_queue;
	__u32 slot_id[PEAK_SLOTS];
	__u32 slot_peak[PEAK_SLOTS];
};

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct pfc_global); } pfc_glob SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, PFC_MAX_PORTS); __type(key, __u32); __type(value, __u32); } pfc_ifs SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, PFC_MAX_PORTS); __type(key, __u64); __type(value, __u32); } pfc_macs SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, PFC_MAX_PORTS); __type(key, __u32); __type(value, struct pfc_link); } pfc_links SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, PFC_MAX_SWITCHES); __type(key, __u32); __type(value, struct pfc_swcfg); } pfc_swcfg SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, PFC_MAX_PORTS * PFC_PRIOS); __type(key, __u32); __type(value, struct pfc_ingress); } pfc_in SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, PFC_MAX_PORTS); __type(key, __u32); __type(value, struct pfc_egress); } pfc_eg SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, PFC_MAX_SWITCHES); __type(key, __u32); __type(value, struct pfc_switch); } pfc_sw SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, PFC_MAX_PORTS + PFC_MAX_SWITCHES); __type(key, __u32); __type(value, struct pfc_peak); } pfc_peaks SEC(".maps");
/* counters: 0 events lost (ring full), 1 tags not ours, 2 doomed packets dropped at egress */
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64); } pfc_cnt SEC(".maps");
/* a doomed packet (its headroom was full at the switch it entered): the switch's, so that a copy of the same
 * bytes elsewhere is never taken for it; the value counts the doomed copies (identical packets of one flow) */
struct pkt_key { __u32 sw; __u32 saddr; __u32 daddr; __u32 ports; __u16 len; __u16 pad; __u8 payload[16]; };
struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, DOOMED_MAX); __type(key, struct pkt_key); __type(value, __u32); } pfc_doomed SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 1 << 18); } pfc_events SEC(".maps");
/* per host NIC (gid): the lossless priorities whose gate the pause agent holds closed now (bit per priority),
 * read by the roce transport's NIC scheduler through an mmap: it stops sending a paused priority */
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, PFC_MAX_PORTS); __uint(map_flags, BPF_F_MMAPABLE); __type(key, __u32); __type(value, __u32); } pfc_nic_paused SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 4096); __type(key, __u32); __type(value, struct ecn_cfg); } hpn_ecn_cfg SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 4096); __type(key, __u32); __type(value, struct ecn_state); } hpn_ecn_state SEC(".maps");

#define TOS_OFF (ETH_HLEN + offsetof(struct iphdr, tos))
#define ID_OFF (ETH_HLEN + offsetof(struct iphdr, id))
#define CSUM_OFF (ETH_HLEN + offsetof(struct iphdr, check))

struct pkt {
	__u8 ip4;
	__u8 tos;
	__u8 proto;
	__u8 ihl;
	__u16 tag;            /* host order */
	__u16 dport;
	__u64 src_mac;
	__u64 dst_mac;
};

static __always_inline void count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&pfc_cnt, &slot);
	if (c)
		__sync_fetch_and_add(c, 1);
}

static __always_inline __u64 mac64(const __u8 *m)
{
	return ((__u64)m[0] << 40) | ((__u64)m[1] << 32) | ((__u64)m[2] << 24) | ((__u64)m[3] << 16) |
	       ((__u64)m[4] << 8) | (__u64)m[5];
}

/* read what the decisions need; 0 on success (any frame), ip4 says whether it is IPv4 */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__u8 eth[14];
	struct iphdr ip;
	__builtin_memset(p, 0, sizeof(*p));
	if (bpf_skb_load_bytes(skb, 0, eth, sizeof(eth)))
		return -1;
	p->dst_mac = mac64(eth);
	p->src_mac = mac64(eth + 6);
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
		return 0;
	p->ip4 = 1;
	p->tos = ip.tos;
	p->proto = ip.protocol;
	p->ihl = ip.ihl;
	p->tag = bpf_ntohs(ip.id);
	if (ip.protocol == IPPROTO_UDP) {
		__u16 dport = 0;
		if (!bpf_skb_load_bytes(skb, ETH_HLEN + (ip.ihl & 15) * 4 + 2, &dport, 2))
			p->dport = bpf_ntohs(dport);
	}
	return 0;
}

static __always_inline __u32 classify(struct pkt *p, struct pfc_global *g)
{
	if (!p->ip4)
		return CLS_HIGH;
	__u32 dscp = p->tos >> 2;
	if (dscp == 48)
		return CLS_HIGH;
	if (p->proto == IPPROTO_UDP && (p->dport == 3784 || p->dport == 4784))
		return CLS_HIGH;                     /* BFD */
	if (p->proto == IPPROTO_UDP && dscp == g->dscp) {
		if (g->bounce && (p->src_mac == g->marks[0] || p->src_mac == g->marks[1]))
			return 1;
		return 0;
	}
	return CLS_LOSSY;
}

static __always_inline void smax(__s64 *p, __s64 v)
{
	if (v > *p)
		*p = v;
}

static __always_inline __s64 xoff(struct pfc_swcfg *c, __s64 used)
{
	if (!c->alpha_q8)
		return c->xoff;
	__s64 free = (__s64)c->shared - used;
	return free > 0 ? (free * (__s64)c->alpha_q8) >> 8 : 0;
}

static __always_inline void emit(__u32 gid, __u32 prio, __u32 type, __u32 seq, __u64 now)
{
	struct pfc_event *e = bpf_ringbuf_reserve(&pfc_events, sizeof(*e), 0);
	if (!e) {
		count(0);
		return;
	}
	e->ts = now;
	e->gid = gid;
	e->prio = prio;
	e->type = type;
	e->seq = seq;
	e->pad = 0;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

struct tagf { __u32 eid; __u32 eg_cls; __u32 in_cls; __u32 in_local; };

static __always_inline void untag(__u16 tag, __u32 kbits, struct tagf *t)
{
	kbits &= 15;
	t->in_local = tag & ((1u << kbits) - 1);
	t->in_cls = (tag >> kbits) & 3;
	t->eg_cls = (tag >> (kbits + 2)) & 3;
	t->eid = (__u32)tag >> (kbits + 4);
}

static __always_inline __u16 mktag(__u32 eid, __u32 eg_cls, __u32 in_cls, __u32 in_local, __u32 kbits)
{
	kbits &= 15;
	return (__u16)((eid << (kbits + 4)) | ((eg_cls & 3) << (kbits + 2)) | ((in_cls & 3) << kbits) | in_local);
}

static __always_inline void retag(struct __sk_buff *skb, __u16 old, __u16 new)
{
	if (old == new)
		return;
	__u16 o = bpf_htons(old), n = bpf_htons(new);
	bpf_l3_csum_replace(skb, CSUM_OFF, o, n, 2);
	bpf_skb_store_bytes(skb, ID_OFF, &n, 2, 0);
}

/* the packet with this tag arrives at the port whose gid is ``here``: it left the upstream's egress
 * queue (and, if it was charged there, its ingress). The tag is ours only if its egress gid's link
 * ends at ``here``: returns 1 then, 0 for a tag that is not (not counted anywhere). */
static __always_inline int depart(struct tagf *t, __u32 here, __u32 len, __u64 now)
{
	if (!t->eid || t->eid >= PFC_MAX_PORTS) {
		count(1);
		return 0;
	}
	__u32 eid = t->eid;
	struct pfc_link *up = bpf_map_lookup_elem(&pfc_links, &eid);
	if (!up || up->peer != here) {
		count(1);
		return 0;
	}
	if (!up->sw)
		return 1;                            /* from a host NIC: nothing charged upstream */
	if (t->eg_cls < PFC_CLASSES) {
		struct pfc_egress *e = bpf_map_lookup_elem(&pfc_eg, &eid);
		if (e) {
			__u32 c = t->eg_cls;
			if (c < PFC_CLASSES)
				__sync_fetch_and_add(&e->bytes[c], -(__s64)len);
		}
	}
	if (t->in_cls >= PFC_PRIOS || !t->in_local)
		return 1;
	__u32 gi = up->base + t->in_local;
	__u32 sw = up->sw - 1;
	__u32 qk = gi * PFC_PRIOS + t->in_cls;
	struct pfc_ingress *q = bpf_map_lookup_elem(&pfc_in, &qk);
	struct pfc_swcfg *c = bpf_map_lookup_elem(&pfc_swcfg, &sw);
	struct pfc_switch *s = bpf_map_lookup_elem(&pfc_sw, &sw);
	if (!q || !c || !s)
		return 1;
	__s64 reserved = c->reserved, resume_off = c->resume;
	__s64 used0 = s->shared_used;
	__s64 from_shared = 0;
	int resume = 0;
	__u32 seq = 0;
	bpf_spin_lock(&q->lock);
	__s64 h = q->headroom;
	__s64 from_h = h < (__s64)len ? h : (__s64)len;
	if (from_h < 0)
		from_h = 0;
	__s64 rest = (__s64)len - from_h;
	__s64 above = q->bytes - reserved;
	if (above < 0)
		above = 0;
	from_shared = rest < above ? rest : above;
	q->headroom = h - from_h;
	q->bytes = q->bytes > rest ? q->bytes - rest : 0;
	__s64 used = used0 - from_shared;
	if (used < 0)
		used = 0;
	__s64 thr = xoff(c, used);
	__s64 su = q->bytes - reserved;
	if (su < 0)
		su = 0;
	__s64 held_ns = 0;
	if (q->paused && q->headroom <= 0 && (su == 0 || su + resume_off <= thr)) {
		q->paused = 0;
		q->resumes += 1;
		held_ns = now - q->pause_since;
		q->paused_ns += held_ns;
		q->seq += 1;
		seq = q->seq;
		resume = 1;
	}
	bpf_spin_unlock(&q->lock);
	if (from_shared)
		__sync_fetch_and_add(&s->shared_used, -from_shared);
	if (resume) {
		struct pfc_peak *pk = bpf_map_lookup_elem(&pfc_peaks, &gi);
		if (pk)
			smax(&pk->pause_ns, held_ns);
		emit(gi, t->in_cls, 0, seq, now);
	}
	return 1;
}

static __always_inline void key_of(struct __sk_buff *skb, struct pkt *p, struct pkt_key *k, __u32 sw)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->sw = sw;
	bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), &k->saddr, 8);
	__u32 l4 = ETH_HLEN + (p->ihl & 15) * 4;
	bpf_skb_load_bytes(skb, l4, &k->ports, 4);
	bpf_skb_load_bytes(skb, l4 + 4, &k->len, 2);
	bpf_skb_load_bytes(skb, l4 + 8, k->payload, sizeof(k->payload));
}

SEC("tc")
int sw_in(struct __sk_buff *skb)
{
	__u32 ifx = skb->ifindex, zero = 0;
	__u32 *gp = bpf_map_lookup_elem(&pfc_ifs, &ifx);
	struct pfc_global *g = bpf_map_lookup_elem(&pfc_glob, &zero);
	struct pkt p;
	if (!gp || !g || parse(skb, &p) || !p.ip4)
		return TC_ACT_OK;
	__u32 gid = *gp, len = skb->len;
	__u64 now = bpf_ktime_get_ns();
	struct tagf t;
	untag(p.tag, g->kbits, &t);
	if (!depart(&t, gid, len, now))
		return TC_ACT_OK;                    /* not tagged by a port of ours: charged nowhere */
	__u32 cls = t.eg_cls;                  /* the class on the wire (classify() at the transmitter) */
	if (cls >= PFC_PRIOS)
		return TC_ACT_OK;
	struct pfc_link *me = bpf_map_lookup_elem(&pfc_links, &gid);
	if (!me || !me->sw)
		return TC_ACT_OK;
	__u32 sw = me->sw - 1;
	__u32 qk = gid * PFC_PRIOS + cls;
	struct pfc_ingress *q = bpf_map_lookup_elem(&pfc_in, &qk);
	struct pfc_swcfg *c = bpf_map_lookup_elem(&pfc_swcfg, &sw);
	struct pfc_switch *s = bpf_map_lookup_elem(&pfc_sw, &sw);
	if (!q || !c || !s)
		return TC_ACT_OK;
	__s64 reserved = c->reserved, hdrm = me->headroom, l = len;
	__s64 used0 = s->shared_used;
	__s64 thr = xoff(c, used0);
	__s64 dshared = 0, held = 0, in_headroom = 0;
	int doomed = 0, pause = 0;
	__u32 seq = 0;
	bpf_spin_lock(&q->lock);
	q->pkts += 1;
	q->octets += len;
	__s64 su = q->bytes - reserved;
	if (su < 0)
		su = 0;
	if (l + q->headroom > hdrm && l + su > thr) {
		q->drops += 1;
		q->drop_bytes += len;
		doomed = 1;
	} else {
		__s64 nb = q->bytes + l;
		if (nb <= reserved) {
			q->bytes = nb;
		} else if (nb - reserved > thr) {
			q->headroom += l;
		} else {
			q->bytes = nb;
			dshared = nb - reserved < l ? nb - reserved : l;
		}
		held = q->bytes + q->headroom;
		in_headroom = q->headroom;
		__s64 thr2 = xoff(c, used0 + dshared);
		__s64 su2 = q->bytes - reserved;
		if (su2 < 0)
			su2 = 0;
		if (!q->paused && (q->headroom > 0 || su2 >= thr2)) {
			q->paused = 1;
			q->pauses += 1;
			q->pause_since = now;
			q->seq += 1;
			seq = q->seq;
			pause = 1;
		}
	}
	bpf_spin_unlock(&q->lock);
	struct pfc_peak *pk = bpf_map_lookup_elem(&pfc_peaks, &gid);
	if (pk) {
		smax(&pk->ingress, held);
		smax(&pk->headroom, in_headroom);
	}
	if (dshared) {
		__s64 u = __sync_fetch_and_add(&s->shared_used, dshared) + dshared;
		__u32 sk = PFC_MAX_PORTS + sw;
		struct pfc_peak *sp = bpf_map_lookup_elem(&pfc_peaks, &sk);
		if (sp)
			smax(&sp->shared, u);
	}
	if (doomed) {
		struct pkt_key k;
		__u32 one = 1;
		key_of(skb, &p, &k, sw);
		__u32 *n = bpf_map_lookup_elem(&pfc_doomed, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
		else if (bpf_map_update_elem(&pfc_doomed, &k, &one, BPF_NOEXIST)) {
			n = bpf_map_lookup_elem(&pfc_doomed, &k);      /* another CPU made it meanwhile */
			if (n)
				__sync_fetch_and_add(n, 1);
		}
	}
	if (pause)
		emit(gid, cls, 1, seq, now);
	return TC_ACT_OK;
}

/* ECN on the real occupancy: the same profile and counters as ecn_marker.bpf.c, with the queue the
 * packet joins (q bytes ahead of it) read from the accounting instead of a virtual queue */
static __always_inline int ecn_mark(struct __sk_buff *skb, struct pkt *p, __u64 q, __u32 len)
{
	__u32 key = skb->ifindex;
	struct ecn_cfg *cfg = bpf_map_lookup_elem(&hpn_ecn_cfg, &key);
	struct ecn_state *st = bpf_map_lookup_elem(&hpn_ecn_state, &key);
	__u64 now = bpf_ktime_get_ns();
	__u32 rnd = bpf_get_prandom_u32();
	int mark = 0;
	if (!cfg || !st)
		return 0;
	__u8 tos = p->tos;
	__u64 kmin = cfg->kmin, kmax = cfg->kmax, pmax = cfg->pmax;
	int ect = (tos & 3) && (tos & 3) != 3;
	if (ect && cfg->enabled && q > kmin) {
		if (q >= kmax || kmax <= kmin)
			mark = 1;
		else if ((__u64)rnd < pmax * (q - kmin) / (kmax - kmin))
			mark = 1;
	}
	__u64 after = q + len;
	bpf_spin_lock(&st->lock);
	st->queue = after;
	st->last_ns = now;
	st->bytes += len;
	st->packets += 1;
	if ((tos & 3) == 3)
		st->ce_seen += 1;
	else if (tos & 3)
		st->ect += 1;
	if (mark)
		st->ce_marked += 1;
	if (after > st->max_queue)
		st->max_queue = after;
	__u64 slot = now / PEAK_SLOT_NS;
	__u32 i = (__u32)slot & (PEAK_SLOTS - 1);
	if (st->slot_id[i] != (__u32)slot) {
		st->slot_id[i] = (__u32)slot;
		st->slot_peak[i] = 0;
	}
	if (after > st->slot_peak[i])
		st->slot_peak[i] = (__u32)after;
	bpf_spin_unlock(&st->lock);
	if (mark) {
		__u8 newtos = tos | 3;
		bpf_l3_csum_replace(skb, CSUM_OFF, bpf_htons((__u16)tos), bpf_htons((__u16)newtos), 2);
		bpf_skb_store_bytes(skb, TOS_OFF, &newtos, 1, 0);
	}
	return mark;
}

SEC("tc")
int sw_out(struct __sk_buff *skb)
{
	__u32 ifx = skb->ifindex, zero = 0;
	if (skb->protocol == bpf_htons(ETH_P_PAUSE))
		return TC_ACT_OK;                      /* a kick frame: htb's direct queue */
	__u32 *gp = bpf_map_lookup_elem(&pfc_ifs, &ifx);
	struct pfc_global *g = bpf_map_lookup_elem(&pfc_glob, &zero);
	struct pkt p;
	if (!gp || !g || parse(skb, &p))
		return TC_ACT_OK;
	__u32 cls = classify(&p, g);
	skb->priority = HTB_MAJOR | g->class_minor[cls & 3];
	if (!p.ip4)
		return TC_ACT_OK;
	__u32 gid = *gp, len = skb->len;
	struct pfc_link *me = bpf_map_lookup_elem(&pfc_links, &gid);
	if (!me || !me->sw)
		return TC_ACT_OK;
	/* the ingress this packet came in by: the previous hop's egress gid names the link */
	struct tagf t;
	untag(p.tag, g->kbits, &t);
	__u32 in_cls = NO_CLASS, in_local = 0;
	if (t.eid && t.eid < PFC_MAX_PORTS) {
		__u32 eid = t.eid;
		struct pfc_link *prev = bpf_map_lookup_elem(&pfc_links, &eid);
		if (prev && prev->peer && prev->peer < PFC_MAX_PORTS) {
			__u32 pg = prev->peer;
			struct pfc_link *ing = bpf_map_lookup_elem(&pfc_links, &pg);
			if (ing && ing->sw == me->sw && t.eg_cls < PFC_PRIOS) {
				in_cls = t.eg_cls;       /* the class on the wire into this switch */
				in_local = ing->local;
			}
		}
	}
	if (cls < PFC_PRIOS) {
		struct pkt_key k;
		key_of(skb, &p, &k, me->sw - 1);
		__u32 *n = bpf_map_lookup_elem(&pfc_doomed, &k);
		if (n && *n) {
			if (__sync_fetch_and_add(n, -1) <= 1)
				bpf_map_delete_elem(&pfc_doomed, &k);
			struct pfc_egress *e = bpf_map_lookup_elem(&pfc_eg, &gid);
			if (e)
				__sync_fetch_and_add(&e->headroom_drops, 1);
			count(2);
			return TC_ACT_SHOT;
		}
	}
	struct pfc_egress *e = bpf_map_lookup_elem(&pfc_eg, &gid);
	if (e && cls < PFC_CLASSES) {
		__u32 c = cls;
		if (c >= PFC_CLASSES)
			return TC_ACT_OK;
		__s64 q = __sync_fetch_and_add(&e->bytes[c], (__s64)len);
		if (c == CLS_LOSSY && me->lossy_limit && q + (__s64)len > (__s64)me->lossy_limit) {
			__sync_fetch_and_add(&e->bytes[c], -(__s64)len);
			__sync_fetch_and_add(&e->lossy_drops, 1);
			return TC_ACT_SHOT;                 /* drop-tail at the lossy buffer, counted here */
		}
		__sync_fetch_and_add(&e->pkts[c], 1);
		struct pfc_peak *pk = bpf_map_lookup_elem(&pfc_peaks, &gid);
		if (pk && c < PFC_CLASSES)
			smax(&pk->egress[c], q + len);
		if (g->ecn)
			ecn_mark(skb, &p, q > 0 ? (__u64)q : 0, len);
	}
	if (cls >= PFC_CLASSES) {
		in_cls = NO_CLASS;
		in_local = 0;
	}
	retag(skb, p.tag, mktag(gid, cls, in_cls, in_local, g->kbits));
	return TC_ACT_OK;
}

static __always_inline __u32 *host_gid(__u64 mac)
{
	return bpf_map_lookup_elem(&pfc_macs, &mac);
}

SEC("tc")
int host_out(struct __sk_buff *skb)
{
	__u32 zero = 0;
	if (skb->protocol == bpf_htons(ETH_P_PAUSE))
		return TC_ACT_OK;
	struct pfc_global *g = bpf_map_lookup_elem(&pfc_glob, &zero);
	struct pkt p;
	if (!g || parse(skb, &p))
		return TC_ACT_OK;
	__u32 cls = classify(&p, g);
	skb->priority = HTB_MAJOR | g->class_minor[cls & 3];
	if (!p.ip4)
		return TC_ACT_OK;
	__u32 *gp = host_gid(p.src_mac);
	if (!gp)
		return TC_ACT_OK;
	retag(skb, p.tag, mktag(*gp, cls, NO_CLASS, 0, g->kbits));
	return TC_ACT_OK;
}

SEC("tc")
int host_in(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct pfc_global *g = bpf_map_lookup_elem(&pfc_glob, &zero);
	struct pkt p;
	if (!g || parse(skb, &p) || !p.ip4)
		return TC_ACT_OK;
	__u32 *gp = host_gid(p.dst_mac);
	if (!gp)
		return TC_ACT_OK;
	struct tagf t;
	untag(p.tag, g->kbits, &t);
	depart(&t, *gp, skb->len, bpf_ktime_get_ns());
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
