// SPDX-License-Identifier: Apache-2.0
/*
 * hpnlab's pause agent: turns the data path's PAUSE/RESUME events (pfc.bpf.c, a ring buffer pinned
 * in bpffs) into gate changes on the upstream transmitter of the port that asked: the tbf "gate"
 * under that transmitter's lossless htb class is closed (rate 1 B/s, one frame of burst) or opened
 * (a fast rate), and on opening one small frame goes through htb's direct queue (the "kick": changing
 * a tbf does not reschedule the qdisc above it, and without a packet to send it may sit for seconds).
 * It runs the PFC watchdog (hpnlab.fabric.workload.lossless.Watchdog states the same rules), measures
 * its reaction (the event's kernel time stamp to the gate change acknowledged), and writes its figures
 * as JSON once a second and when it ends. On SIGTERM/SIGINT, and with --reopen alone, it opens every
 * gate. Started and configured by hpnlab.fabric.emulation.pfc (which writes the configuration file).
 *
 * usage: pfc_agent CONFIG            run until SIGTERM or SIGINT; prints "ready N" once set up
 *        pfc_agent --reopen CONFIG   open every gate and exit
 *
 * CONFIG, one item a line ('#' comments):
 *   events PATH                      the pinned ring buffer
 *   stats PATH                       where the JSON figures go
 *   open RATE_BPS BURST LIMIT        an open gate (bytes/s, bytes, bytes)
 *   closed RATE_BPS BURST            a closed gate
 *   watchdog DETECT_MS RESTORE_MS    0 DETECT_MS: no watchdog
 *   gate PRIO PARENT HANDLE          a lossless priority's gate: htb class (e.g. 0x10011) and tbf handle
 *   target GID NETNS IFNAME [NIC]    the transmitter an ingress port (gid) pauses; NETNS "-": ours,
 *                                    else a path like /proc/PID/ns/net; NIC: the transmitter's gid when
 *                                    it is a host NIC (its pause state goes to the nicmap for its transport)
 *   nicmap PATH                      the pinned array of host NICs' paused priorities (bit per priority)
 *   ingress PATH                     the data path's ingress queues (pinned pfc_in): every RECONCILE_MS the
 *                                    agent holds each gate to what its queue says now, so a decision whose
 *                                    event was lost (a full ring) or came late cannot hold a gate for ever
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <net/if.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#define MAX_GIDS 4096
#define PRIOS 2
#define MAX_NS 512

struct pfc_event { uint64_t ts; uint32_t gid; uint16_t prio; uint16_t type; uint32_t seq; uint32_t pad; };

struct msg { char b[512]; size_t len; };

struct gate_state {
	int desired;              /* the downstream asks for a pause */
	int closed;               /* the gate as last set */
	uint32_t seq;             /* newest decision applied */
	int have_seq;
	uint64_t since;           /* pause in force since (ns) */
	uint64_t ignoring_until;  /* the watchdog holds the gate open until then (0: not) */
	uint64_t storms;
	struct msg pause, resume;
};

struct target {
	int valid;
	int nl, kick, ifindex;
	int nic;                  /* the transmitter's gid when it is a host NIC (0: a switch port) */
	char ns[128], ifname[IFNAMSIZ];
	struct gate_state g[PRIOS];
};

static struct target targets[MAX_GIDS];
static struct { int prio; uint32_t parent, handle; int valid; } gates[PRIOS];
static uint64_t open_rate = 125000000ull, open_burst = 65536, open_limit = 1 << 26, closed_rate = 1, closed_burst = 1514;
static uint64_t detect_ns, restore_ns;
static char events_path[512], stats_path[512], nicmap_path[512], ingress_path[512];
static int nicmap_fd = -1, ingress_fd = -1;
#define RECONCILE_NS 50000000ull
/* pfc.bpf.c's struct pfc_ingress: where ``paused`` and ``seq`` are */
#define INGRESS_SIZE 96
#define INGRESS_PAUSED 4
#define INGRESS_SEQ 88
static volatile sig_atomic_t stopping;

/* reaction histogram: 1 us buckets to 1 ms, 10 us to 10 ms, 1 ms to 1 s, then one */
#define NB (1000 + 900 + 990 + 1)
static uint64_t hist_pause[NB], hist_resume[NB];
static uint64_t n_events, n_stale, n_pauses, n_resumes, n_nl_errors, n_kick_errors, n_storms, n_restores, n_reconciled;
static uint64_t t_start;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int bucket(uint64_t ns)
{
	uint64_t us = ns / 1000;
	if (us < 1000)
		return (int)us;
	if (us < 10000)
		return 1000 + (int)((us - 1000) / 10);
	if (us < 1000000)
		return 1900 + (int)((us - 10000) / 1000);
	return NB - 1;
}

static uint64_t bucket_upper_us(int b)
{
	if (b < 1000)
		return b + 1;
	if (b < 1900)
		return 1000 + (uint64_t)(b - 1000 + 1) * 10;
	if (b < NB - 1)
		return 10000 + (uint64_t)(b - 1900 + 1) * 1000;
	return 0;                 /* beyond a second */
}

/* ---- rtnetlink: a tbf's rate, burst and limit changed in place ---------------------------- */

static void attr(struct msg *m, int type, const void *data, int alen)
{
	struct rtattr *rta = (struct rtattr *)(m->b + NLMSG_ALIGN(m->len));
	rta->rta_type = type;
	rta->rta_len = RTA_LENGTH(alen);
	if (alen)
		memcpy(RTA_DATA(rta), data, alen);
	m->len = NLMSG_ALIGN(m->len) + RTA_ALIGN(rta->rta_len);
}

static uint32_t ticks(uint64_t rate, uint32_t bytes)
{
	long double ns = (long double)bytes * 1e9L / (long double)rate;
	long double t = ns / 64.0L;   /* psched ticks are 64 ns */
	return t > 4294967295.0L ? 0xffffffffu : (uint32_t)t;
}

static void build_tbf(struct msg *m, int ifindex, uint32_t handle, uint32_t parent, uint64_t rate, uint32_t burst,
		      uint32_t limit)
{
	memset(m, 0, sizeof(*m));
	struct nlmsghdr *n = (struct nlmsghdr *)m->b;
	n->nlmsg_type = RTM_NEWQDISC;
	n->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	struct tcmsg *t = NLMSG_DATA(n);
	t->tcm_family = AF_UNSPEC;
	t->tcm_ifindex = ifindex;
	t->tcm_handle = handle;
	t->tcm_parent = parent;
	m->len = NLMSG_LENGTH(sizeof(struct tcmsg));
	attr(m, TCA_KIND, "tbf", 4);
	struct rtattr *opt = (struct rtattr *)(m->b + NLMSG_ALIGN(m->len));
	attr(m, TCA_OPTIONS, NULL, 0);
	struct tc_tbf_qopt q;
	memset(&q, 0, sizeof(q));
	q.rate.linklayer = TC_LINKLAYER_ETHERNET;
	q.rate.rate = rate >= (1ull << 32) ? ~0u : (uint32_t)rate;
	q.limit = limit;
	q.buffer = ticks(rate, burst);
	attr(m, TCA_TBF_PARMS, &q, sizeof(q));
	if (rate >= (1ull << 32))
		attr(m, TCA_TBF_RATE64, &rate, 8);
	attr(m, TCA_TBF_BURST, &burst, 4);
	opt->rta_len = (m->b + m->len) - (char *)opt;
	n->nlmsg_len = m->len;
}

static int nl_open(void)
{
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (fd < 0)
		return -1;
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int nl_talk(int fd, struct msg *m)
{
	static uint32_t seq = 1;
	struct nlmsghdr *n = (struct nlmsghdr *)m->b;
	n->nlmsg_seq = ++seq;
	if (send(fd, m->b, m->len, 0) < 0)
		return -errno;
	char rb[4096];
	for (;;) {
		ssize_t r = recv(fd, rb, sizeof(rb), 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)rb; NLMSG_OK(h, (size_t)r); h = NLMSG_NEXT(h, r)) {
			if (h->nlmsg_seq != seq)
				continue;
			if (h->nlmsg_type == NLMSG_ERROR)
				return ((struct nlmsgerr *)NLMSG_DATA(h))->error;
		}
	}
}

/* a packet socket on the interface whose frames go to htb's direct queue (priority = htb's handle 1:) */
static int kick_open(int ifindex)
{
	int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_ifindex = ifindex, .sll_protocol = 0 };
	if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0) {
		close(fd);
		return -1;
	}
	uint32_t prio = 0x10000;
	setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &prio, sizeof(prio));
	return fd;
}

static void kick(struct target *t)
{
	/* 60 bytes to 01:80:c2:00:00:01, ethertype 0x8808 (a MAC control frame, as a PAUSE frame is):
	 * the switches' tables drop it, a host's stack ignores it */
	static const unsigned char f[60] = { 0x01, 0x80, 0xc2, 0x00, 0x00, 0x01, 0x02, 0, 0, 0, 0, 0x01, 0x88, 0x08 };
	if (t->kick < 0 || send(t->kick, f, sizeof(f), MSG_DONTWAIT) < 0)
		n_kick_errors++;
}

static int enter_ns(const char *path, int home)
{
	if (!strcmp(path, "-"))
		return setns(home, CLONE_NEWNET);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int r = setns(fd, CLONE_NEWNET);
	close(fd);
	return r;
}

/* ---- gates --------------------------------------------------------------------------------- */

/* a host NIC's paused priorities, for its transport (after the gate: the NIC never sends into a closed one
 * for long, and stops offering its queue pairs' packets while it is closed) */
static void publish(struct target *t)
{
	if (nicmap_fd < 0 || !t->nic)
		return;
	uint32_t key = t->nic, bits = 0;
	for (int p = 0; p < PRIOS; p++)
		bits |= (uint32_t)t->g[p].closed << p;
	bpf_map_update_elem(nicmap_fd, &key, &bits, BPF_ANY);
}

static int set_gate(struct target *t, int prio, int closed)
{
	struct gate_state *g = &t->g[prio];
	int r = nl_talk(t->nl, closed ? &g->pause : &g->resume);
	if (r) {
		n_nl_errors++;
		return r;
	}
	g->closed = closed;
	if (!closed)
		kick(t);
	publish(t);
	return 0;
}

static void open_all(void)
{
	for (int i = 0; i < MAX_GIDS; i++) {
		struct target *t = &targets[i];
		if (!t->valid)
			continue;
		for (int p = 0; p < PRIOS; p++)
			if (gates[p].valid)
				set_gate(t, p, 0);
	}
}

static int on_event(void *ctx, void *data, size_t size)
{
	(void)ctx;
	if (size < sizeof(struct pfc_event))
		return 0;
	struct pfc_event *e = data;
	n_events++;
	if (e->gid >= MAX_GIDS || e->prio >= PRIOS || !targets[e->gid].valid || !gates[e->prio].valid)
		return 0;
	struct target *t = &targets[e->gid];
	struct gate_state *g = &t->g[e->prio];
	if (g->have_seq && (int32_t)(e->seq - g->seq) <= 0) {
		n_stale++;                /* an older decision than one already applied (another CPU's) */
		return 0;
	}
	g->seq = e->seq;
	g->have_seq = 1;
	if (e->type) {
		g->desired = 1;
		g->since = e->ts;
		if (!g->ignoring_until && !g->closed && !set_gate(t, e->prio, 1)) {
			n_pauses++;
			hist_pause[bucket(now_ns() - e->ts)]++;
		}
	} else {
		g->desired = 0;
		g->since = 0;
		if (g->closed && !set_gate(t, e->prio, 0)) {
			n_resumes++;
			hist_resume[bucket(now_ns() - e->ts)]++;
		}
	}
	return 0;
}

/* every gate held to what its queue says now (the data path's pause flag and decision count): a lost or late
 * event is mended within RECONCILE_NS */
static void reconcile(uint64_t now)
{
	if (ingress_fd < 0)
		return;
	unsigned char v[INGRESS_SIZE];
	for (int i = 0; i < MAX_GIDS; i++) {
		struct target *t = &targets[i];
		if (!t->valid)
			continue;
		for (int p = 0; p < PRIOS; p++) {
			if (!gates[p].valid)
				continue;
			uint32_t key = (uint32_t)i * PRIOS + p, paused, seq;
			if (bpf_map_lookup_elem_flags(ingress_fd, &key, v, BPF_F_LOCK))   /* consistent: under its lock */
				continue;
			memcpy(&paused, v + INGRESS_PAUSED, 4);
			memcpy(&seq, v + INGRESS_SEQ, 4);
			struct gate_state *g = &t->g[p];
			if (g->have_seq && (int32_t)(seq - g->seq) <= 0)
				continue;       /* nothing decided since the last event applied */
			if ((int)!!paused == g->desired) {
				g->seq = seq;
				g->have_seq = 1;
				continue;
			}
			n_reconciled++;
			g->seq = seq;
			g->have_seq = 1;
			g->desired = !!paused;
			if (paused) {
				g->since = now;
				if (!g->ignoring_until && !g->closed)
					set_gate(t, p, 1);
			} else {
				g->since = 0;
				if (g->closed)
					set_gate(t, p, 0);
			}
		}
	}
}

/* the watchdog (lossless.Watchdog): returns the next deadline (0: none) */
static uint64_t watchdog(uint64_t now)
{
	uint64_t next = 0;
	if (!detect_ns)
		return 0;
	for (int i = 0; i < MAX_GIDS; i++) {
		struct target *t = &targets[i];
		if (!t->valid)
			continue;
		for (int p = 0; p < PRIOS; p++) {
			struct gate_state *g = &t->g[p];
			if (!gates[p].valid)
				continue;
			if (g->ignoring_until) {
				if (now >= g->ignoring_until) {
					g->ignoring_until = 0;
					n_restores++;
					if (g->desired) {
						g->since = now;
						set_gate(t, p, 1);
					}
				}
			} else if (g->desired && now > g->since && now - g->since >= detect_ns) {
				/* (an event's time may be later than ``now``, taken before the ring was read) */
				g->ignoring_until = now + restore_ns;
				g->storms++;
				n_storms++;
				fprintf(stderr, "pfc watchdog: gid %d priority %d paused %.1f ms: not honoured for %.0f ms\n",
					i, p, (now - g->since) / 1e6, restore_ns / 1e6);
				if (g->closed)
					set_gate(t, p, 0);
			}
			uint64_t d = g->ignoring_until ? g->ignoring_until : g->desired ? g->since + detect_ns : 0;
			if (d && (!next || d < next))
				next = d;
		}
	}
	return next;
}

/* ---- figures ------------------------------------------------------------------------------- */

static void write_hist(FILE *f, const char *name, uint64_t *h)
{
	fprintf(f, "\"%s\":[", name);
	int first = 1;
	for (int b = 0; b < NB; b++) {
		if (!h[b])
			continue;
		fprintf(f, "%s[%llu,%llu]", first ? "" : ",", (unsigned long long)bucket_upper_us(b),
			(unsigned long long)h[b]);
		first = 0;
	}
	fprintf(f, "]");
}

static void write_stats(int final)
{
	if (!stats_path[0])
		return;
	char tmp[600];
	snprintf(tmp, sizeof(tmp), "%s.tmp", stats_path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
	int closed = 0, ntargets = 0;
	for (int i = 0; i < MAX_GIDS; i++) {
		if (!targets[i].valid)
			continue;
		ntargets++;
		for (int p = 0; p < PRIOS; p++)
			closed += targets[i].g[p].closed;
	}
	fprintf(f, "{\"pid\":%d,\"final\":%s,\"wall_s\":%.3f,\"cpu_s\":%.4f,\"targets\":%d,\"gates_closed\":%d,"
		"\"events\":%llu,\"stale_events\":%llu,\"pauses\":%llu,\"resumes\":%llu,\"netlink_errors\":%llu,"
		"\"kick_errors\":%llu,\"storms\":%llu,\"restores\":%llu,\"reconciled\":%llu,",
		getpid(), final ? "true" : "false", (now_ns() - t_start) / 1e9, cpu, ntargets, closed,
		(unsigned long long)n_events, (unsigned long long)n_stale, (unsigned long long)n_pauses,
		(unsigned long long)n_resumes, (unsigned long long)n_nl_errors, (unsigned long long)n_kick_errors,
		(unsigned long long)n_storms, (unsigned long long)n_restores, (unsigned long long)n_reconciled);
	fprintf(f, "\"storms_by_gid\":[");
	int first = 1;
	for (int i = 0; i < MAX_GIDS; i++)
		for (int p = 0; p < PRIOS; p++)
			if (targets[i].valid && targets[i].g[p].storms) {
				fprintf(f, "%s[%d,%d,%llu]", first ? "" : ",", i, p,
					(unsigned long long)targets[i].g[p].storms);
				first = 0;
			}
	fprintf(f, "],");
	write_hist(f, "pause_us", hist_pause);
	fprintf(f, ",");
	write_hist(f, "resume_us", hist_resume);
	fprintf(f, "}\n");
	fclose(f);
	rename(tmp, stats_path);
}

/* ---- configuration ------------------------------------------------------------------------- */

static int configure(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		perror(path);
		return -1;
	}
	int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	char line[512];
	int lineno = 0;
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		char kw[16];
		if (sscanf(line, "%15s", kw) != 1 || kw[0] == '#')
			continue;
		if (!strcmp(kw, "events")) {
			sscanf(line, "%*s %511s", events_path);
		} else if (!strcmp(kw, "stats")) {
			sscanf(line, "%*s %511s", stats_path);
		} else if (!strcmp(kw, "nicmap")) {
			sscanf(line, "%*s %511s", nicmap_path);
		} else if (!strcmp(kw, "ingress")) {
			sscanf(line, "%*s %511s", ingress_path);
		} else if (!strcmp(kw, "open")) {
			unsigned long long r, b, l;
			if (sscanf(line, "%*s %llu %llu %llu", &r, &b, &l) == 3)
				open_rate = r, open_burst = b, open_limit = l;
		} else if (!strcmp(kw, "closed")) {
			unsigned long long r, b;
			if (sscanf(line, "%*s %llu %llu", &r, &b) == 2)
				closed_rate = r, closed_burst = b;
		} else if (!strcmp(kw, "watchdog")) {
			unsigned long long d, r;
			if (sscanf(line, "%*s %llu %llu", &d, &r) == 2)
				detect_ns = d * 1000000ull, restore_ns = r * 1000000ull;
		} else if (!strcmp(kw, "gate")) {
			int p;
			unsigned int parent, handle;
			if (sscanf(line, "%*s %d %i %i", &p, &parent, &handle) == 3 && p >= 0 && p < PRIOS) {
				gates[p].prio = p;
				gates[p].parent = parent;
				gates[p].handle = handle;
				gates[p].valid = 1;
			}
		} else if (!strcmp(kw, "target")) {
			int gid, nic = 0;
			char ns[128], ifn[IFNAMSIZ];
			int got = sscanf(line, "%*s %d %127s %15s %d", &gid, ns, ifn, &nic);
			if (got < 3 || gid <= 0 || gid >= MAX_GIDS || nic < 0 || nic >= MAX_GIDS) {
				fprintf(stderr, "%s:%d: bad target line\n", path, lineno);
				return -1;
			}
			struct target *t = &targets[gid];
			if (enter_ns(ns, home)) {
				fprintf(stderr, "%s:%d: cannot enter %s: %s\n", path, lineno, ns, strerror(errno));
				return -1;
			}
			t->ifindex = if_nametoindex(ifn);
			t->nl = t->ifindex ? nl_open() : -1;
			t->kick = t->ifindex ? kick_open(t->ifindex) : -1;
			setns(home, CLONE_NEWNET);
			if (!t->ifindex || t->nl < 0) {
				fprintf(stderr, "%s:%d: no interface %s in %s\n", path, lineno, ifn, ns);
				return -1;
			}
			t->nic = got == 4 ? nic : 0;
			snprintf(t->ns, sizeof(t->ns), "%s", ns);
			snprintf(t->ifname, sizeof(t->ifname), "%s", ifn);
			t->valid = 1;
		} else {
			fprintf(stderr, "%s:%d: unknown item %s\n", path, lineno, kw);
			return -1;
		}
	}
	fclose(f);
	close(home);
	if (ingress_path[0]) {
		ingress_fd = bpf_obj_get(ingress_path);
		if (ingress_fd < 0)
			fprintf(stderr, "cannot open %s: a lost event may hold a gate\n", ingress_path);
	}
	if (nicmap_path[0]) {
		nicmap_fd = bpf_obj_get(nicmap_path);
		if (nicmap_fd < 0)
			fprintf(stderr, "cannot open %s: the transports will not see pauses\n", nicmap_path);
	}
	for (int i = 0; i < MAX_GIDS; i++) {
		struct target *t = &targets[i];
		if (!t->valid)
			continue;
		for (int p = 0; p < PRIOS; p++) {
			if (!gates[p].valid)
				continue;
			build_tbf(&t->g[p].pause, t->ifindex, gates[p].handle, gates[p].parent, closed_rate,
				  (uint32_t)closed_burst, (uint32_t)open_limit);
			build_tbf(&t->g[p].resume, t->ifindex, gates[p].handle, gates[p].parent, open_rate,
				  (uint32_t)open_burst, (uint32_t)open_limit);
		}
	}
	return 0;
}

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

int main(int argc, char **argv)
{
	int reopen = argc == 3 && !strcmp(argv[1], "--reopen");
	if (argc != 2 && !reopen) {
		fprintf(stderr, "usage: pfc_agent CONFIG | pfc_agent --reopen CONFIG\n");
		return 2;
	}
	t_start = now_ns();
	if (configure(argv[argc - 1]))
		return 1;
	if (reopen) {
		open_all();
		return n_nl_errors ? 1 : 0;
	}
	mlockall(MCL_CURRENT | MCL_FUTURE);
	libbpf_set_print(NULL);
	int fd = bpf_obj_get(events_path);
	if (fd < 0) {
		fprintf(stderr, "cannot open the event ring %s: %s\n", events_path, strerror(errno));
		return 1;
	}
	struct ring_buffer *rb = ring_buffer__new(fd, on_event, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "cannot read the event ring %s\n", events_path);
		return 1;
	}
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	int n = 0;
	for (int i = 0; i < MAX_GIDS; i++)
		n += targets[i].valid;
	printf("ready %d\n", n);
	fflush(stdout);
	uint64_t next_stats = now_ns() + 1000000000ull, next_reconcile = now_ns() + RECONCILE_NS;
	while (!stopping) {
		uint64_t now = now_ns();
		if (now >= next_reconcile) {
			ring_buffer__consume(rb);      /* the events first: they are newer than nothing */
			reconcile(now_ns());
			next_reconcile = now_ns() + RECONCILE_NS;
			now = now_ns();
		}
		uint64_t deadline = watchdog(now);
		uint64_t wake = next_stats < next_reconcile ? next_stats : next_reconcile;
		if (deadline && deadline < wake)
			wake = deadline;
		int ms = wake > now ? (int)((wake - now + 999999) / 1000000) : 0;
		if (ms > 100)
			ms = 100;
		int r = ring_buffer__poll(rb, ms);
		if (r < 0 && r != -EINTR)
			break;
		if (now_ns() >= next_stats) {
			write_stats(0);
			next_stats = now_ns() + 1000000000ull;
		}
	}
	ring_buffer__consume(rb);
	open_all();
	write_stats(1);
	ring_buffer__free(rb);
	return 0;
}
