// fabric_probe: standalone measurements of libfabric 1.17 behaviour for Ferry's fabric transport.
// Build: g++ -O2 -std=c++20 probe.cc -o probe -lfabric
// Two processes (fork): the parent is the initiator, the child the target. They exchange the
// target's endpoint name, MR address and key over a socketpair; the target drives its own progress
// (fi_cq_read) whenever it is not told otherwise. Every wait is bounded. tcp is pinned to
// 127.0.0.1. Usage: see README.md (./probe help).
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char* what, int rc) {
  std::fprintf(stderr, "[%d] %s: %d (%s)\n", getpid(), what, rc, fi_strerror(-rc));
  std::exit(2);
}
#define CK(x)              \
  do {                     \
    int rc_ = (x);         \
    if (rc_) die(#x, rc_); \
  } while (0)

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint8_t pat(uint32_t seed, uint32_t op, size_t j) {
  uint64_t x =
      (uint64_t(seed) * 0x9E3779B1u) ^ (uint64_t(op + 1) * 0x85EBCA6Bu) ^ ((j >> 4) * 0xC2B2AE35u);
  x ^= x >> 15;
  x *= 0x2545F4914F6CDD1DULL;
  x ^= x >> 29;
  return uint8_t(x + j);
}

struct Fab {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  bool virt = true, prov_key = false, ep_mr = false, local = false;
};

fi_info* make_hints(const char* prov) {
  fi_info* h = fi_allocinfo();
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  h->fabric_attr->prov_name = strdup(prov);
  return h;
}

int get_info(const char* prov, fi_info* hints, fi_info** out) {
  bool is_tcp = std::strncmp(prov, "tcp", 3) == 0;
  // tcp: bind the source to loopback; shm needs no network address.
  return fi_getinfo(FI_VERSION(1, 17), is_tcp ? "127.0.0.1" : nullptr, nullptr,
                    is_tcp ? FI_SOURCE : 0, hints, out);
}

void open_fab(Fab& f, const char* prov, bool wait_fd = false) {
  fi_info* h = make_hints(prov);
  CK(get_info(prov, h, &f.info));
  fi_freeinfo(h);
  uint64_t m = f.info->domain_attr->mr_mode;
  f.virt = m & FI_MR_VIRT_ADDR;
  f.prov_key = m & FI_MR_PROV_KEY;
  f.ep_mr = m & FI_MR_ENDPOINT;
  f.local = m & FI_MR_LOCAL;
  CK(fi_fabric(f.info->fabric_attr, &f.fabric, nullptr));
  CK(fi_domain(f.fabric, f.info, &f.domain, nullptr));
  fi_av_attr av{};
  av.type = FI_AV_TABLE;
  CK(fi_av_open(f.domain, &av, &f.av, nullptr));
  fi_cq_attr cq{};
  cq.format = FI_CQ_FORMAT_DATA;
  cq.size = 4096;
  cq.wait_obj = wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
  CK(fi_cq_open(f.domain, &cq, &f.cq, nullptr));
  CK(fi_endpoint(f.domain, f.info, &f.ep, nullptr));
  CK(fi_ep_bind(f.ep, &f.av->fid, 0));
  CK(fi_ep_bind(f.ep, &f.cq->fid, FI_TRANSMIT | FI_RECV));
  CK(fi_enable(f.ep));
}

fid_mr* reg(Fab& f, void* p, size_t n, uint64_t access, uint64_t req_key) {
  fid_mr* mr = nullptr;
  CK(fi_mr_reg(f.domain, p, n, access, 0, req_key, 0, &mr, nullptr));
  if (f.ep_mr) {
    CK(fi_mr_bind(mr, &f.ep->fid, 0));
    CK(fi_mr_enable(mr));
  }
  return mr;
}

void close_fab(Fab& f) {
  fi_close(&f.ep->fid);
  fi_close(&f.cq->fid);
  fi_close(&f.av->fid);
  fi_close(&f.domain->fid);
  fi_close(&f.fabric->fid);
  fi_freeinfo(f.info);
}

// ---------------- control channel ----------------
enum CmdOp : int32_t { kClear = 1, kVerify, kFill, kWatch, kCloseMr, kPause, kRegSub, kExit };
constexpr size_t kGuard = 1u << 20;  // kRegSub registers the buffer minus 1 MiB guards at both ends
struct Cmd {
  int32_t op;
  uint32_t seed;
  uint64_t size;
  uint32_t n;
  int32_t arg;
};
struct Resp {
  int64_t bad_bytes, bad_ops, first_bad_op, landed_ops;
  double t;
};
void xwrite(int fd, const void* p, size_t n) {
  if (write(fd, p, n) != ssize_t(n)) die("ctl write", -errno);
}
bool xread(int fd, void* p, size_t n, int timeout_ms) {
  char* c = static_cast<char*>(p);
  size_t got = 0;
  double end = now_s() + timeout_ms / 1000.0;
  while (got < n) {
    pollfd pf{fd, POLLIN, 0};
    int left = int((end - now_s()) * 1000);
    if (left <= 0) return false;
    if (poll(&pf, 1, left) <= 0) continue;
    ssize_t r = read(fd, c + got, n - got);
    if (r <= 0) return false;
    got += size_t(r);
  }
  return true;
}

constexpr size_t kTargetBytes = 64ull << 20;
constexpr size_t kRGap = 64;  // gap between remote pieces of a multi-rma_iov op
size_t rstride(size_t size, int nriov) { return size + (nriov > 1 ? size_t(nriov) * kRGap : 0); }
size_t roff(size_t size, int nriov, size_t j) {
  if (nriov <= 1) return j;
  size_t piece = size / size_t(nriov);
  size_t k = std::min(j / piece, size_t(nriov - 1));
  return j + k * kRGap;
}

struct Hello {
  char name[256];
  size_t namelen;
  uint64_t addr, key, size;
};

// ---------------- target ----------------
int run_target(const char* prov, int sock, uint8_t* buf) {
  Fab f;
  open_fab(f, prov);
  fid_mr* mr = reg(f, buf, kTargetBytes, FI_REMOTE_READ | FI_REMOTE_WRITE, 0x1234);
  Hello h{};
  h.namelen = sizeof(h.name);
  CK(fi_getname(&f.ep->fid, h.name, &h.namelen));
  h.addr = f.virt ? uint64_t(uintptr_t(buf)) : 0;
  h.key = fi_mr_key(mr);
  h.size = kTargetBytes;
  xwrite(sock, &h, sizeof(h));
  double deadline = now_s() + 600;  // the target never outlives 10 minutes
  auto progress = [&] {
    fi_cq_data_entry e[16];
    ssize_t r = fi_cq_read(f.cq, e, 16);
    if (r == -FI_EAVAIL) {
      fi_cq_err_entry ee{};
      fi_cq_readerr(f.cq, &ee, 0);
    }
  };
  while (now_s() < deadline) {
    progress();
    pollfd pf{sock, POLLIN, 0};
    if (poll(&pf, 1, 0) <= 0) continue;
    Cmd c{};
    if (!xread(sock, &c, sizeof(c), 5000)) break;
    Resp r{};
    int nr = (c.op == kWatch) ? 1 : std::max(c.arg, 1);
    size_t rs = rstride(c.size, nr);
    size_t span = rs * c.n;
    if (span > kTargetBytes) span = kTargetBytes;
    if (c.op == kClear) {
      std::memset(buf, 0, span);
    } else if (c.op == kFill) {
      for (uint32_t i = 0; i < c.n; ++i)
        for (size_t j = 0; j < c.size; ++j) buf[i * rs + roff(c.size, nr, j)] = pat(c.seed, i, j);
    } else if (c.op == kVerify) {
      r.first_bad_op = -1;
      for (uint32_t i = 0; i < c.n; ++i) {
        int64_t b = 0;
        for (size_t j = 0; j < c.size; ++j)
          b += buf[i * rs + roff(c.size, nr, j)] != pat(c.seed, i, j);
        if (nr > 1)  // the gaps between remote pieces must stay zero
          for (int k = 0; k < nr; ++k)
            for (size_t q = 0; q < kRGap; ++q)
              b += buf[i * rs +
                       roff(c.size, nr, k == nr - 1 ? c.size - 1 : (c.size / nr) * (k + 1) - 1) +
                       1 + q] != 0;
        if (b) {
          r.bad_ops++;
          if (r.first_bad_op < 0) r.first_bad_op = i;
        }
        r.bad_bytes += b;
      }
    } else if (c.op == kWatch) {
      // No progress for c.arg ms, then progress; report when all c.n ops' bytes had landed.
      xwrite(sock, &r, sizeof(r));  // "started"
      double t0 = now_s(), stop = t0 + 10;
      std::vector<char> landed(c.n, 0);
      int64_t nland = 0;
      while (now_s() < stop && nland < c.n) {
        if (now_s() - t0 > c.arg / 1000.0) progress();
        for (uint32_t i = 0; i < c.n; ++i) {
          if (landed[i]) continue;
          bool ok = true;
          for (size_t j = 0; j < c.size && ok; j += 1)
            ok = buf[i * c.size + j] == pat(c.seed, i, j);
          if (ok) {
            landed[i] = 1;
            ++nland;
          }
        }
      }
      r.landed_ops = nland;
      r.t = now_s();
    } else if (c.op == kPause) {
      usleep(c.arg * 1000);
    } else if (c.op == kCloseMr) {
      r.bad_bytes = fi_close(&mr->fid);
    } else if (c.op == kRegSub) {
      fi_close(&mr->fid);
      mr =
          reg(f, buf + kGuard, kTargetBytes - 2 * kGuard, FI_REMOTE_READ | FI_REMOTE_WRITE, 0x5678);
      r.bad_bytes = int64_t(f.virt ? uint64_t(uintptr_t(buf + kGuard)) : 0);
      r.bad_ops = int64_t(fi_mr_key(mr));
    } else if (c.op == kExit) {
      xwrite(sock, &r, sizeof(r));
      break;
    }
    xwrite(sock, &r, sizeof(r));
  }
  close_fab(f);
  return 0;
}

// ---------------- initiator ----------------
struct Init {
  Fab f;
  int sock = -1;
  pid_t child = -1;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  Hello h{};
  uint8_t* lbuf = nullptr;
  size_t lbytes = 0;
  fid_mr* lmr = nullptr;
  std::vector<fi_context2> ctx;
  uint8_t* tbuf =
      nullptr;  // the target's registered buffer: a MAP_SHARED mapping made before fork,
                // so the initiator can look at the target's memory without the provider
  long err_entries = 0;
  long eagain = 0;             // -FI_EAGAIN returns from fi_writemsg/fi_readmsg
  bool ignore_eagain = false;  // mimic a program that treats -FI_EAGAIN as posted
  bool no_retry = false;       // return -FI_EAGAIN at once
  fi_cq_err_entry last_err{};
};

bool start(Init& in, const char* prov) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair", -errno);
  in.tbuf = static_cast<uint8_t*>(
      mmap(nullptr, kTargetBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (in.tbuf == MAP_FAILED) die("mmap", -errno);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t p = fork();
  if (p == 0) {
    close(sv[0]);
    std::exit(run_target(prov, sv[1], in.tbuf));
  }
  close(sv[1]);
  in.sock = sv[0];
  in.child = p;
  open_fab(in.f, prov);
  if (!xread(in.sock, &in.h, sizeof(in.h), 10000)) {
    std::fprintf(stderr, "no hello from target\n");
    return false;
  }
  int n = fi_av_insert(in.f.av, in.h.name, 1, &in.peer, 0, nullptr);
  if (n != 1) die("fi_av_insert", n);
  in.lbytes = 80ull << 20;
  in.lbuf = static_cast<uint8_t*>(aligned_alloc(4096, in.lbytes));
  std::memset(in.lbuf, 0, in.lbytes);
  in.lmr = reg(in.f, in.lbuf, in.lbytes, FI_READ | FI_WRITE, 0x99);
  in.ctx.resize(8192);
  return true;
}

Resp cmd(Init& in, int32_t op, uint32_t seed, uint64_t size, uint32_t n, int32_t arg = 0) {
  Cmd c{op, seed, size, n, arg};
  xwrite(in.sock, &c, sizeof(c));
  Resp r{};
  if (!xread(in.sock, &r, sizeof(r), 60000)) {
    std::fprintf(stderr, "target did not answer cmd %d\n", op);
    std::exit(3);
  }
  return r;
}

void stop(Init& in) {
  cmd(in, kExit, 0, 0, 0);
  int st = 0;
  for (int i = 0; i < 500 && waitpid(in.child, &st, WNOHANG) == 0; ++i) usleep(10000);
  kill(in.child, SIGKILL);
  waitpid(in.child, &st, WNOHANG);
  fi_close(&in.lmr->fid);
  close_fab(in.f);
  free(in.lbuf);
}

// Reads completions for up to timeout; returns number of successful completions, counts errors.
long reap(Init& in, long want, double timeout_s, std::vector<double>* times = nullptr) {
  long got = 0;
  double end = now_s() + timeout_s;
  while (got < want && now_s() < end) {
    fi_cq_data_entry e[64];
    ssize_t r = fi_cq_read(in.f.cq, e, 64);
    if (r > 0) {
      got += r;
      if (times)
        for (ssize_t i = 0; i < r; ++i) times->push_back(now_s());
    } else if (r == -FI_EAVAIL) {
      fi_cq_err_entry ee{};
      fi_cq_readerr(in.f.cq, &ee, 0);
      in.last_err = ee;
      in.err_entries++;
      got++;
      if (times) times->push_back(now_s());
    } else if (r != -FI_EAGAIN) {
      die("fi_cq_read", int(r));
    }
  }
  return got;
}

struct OpSpec {
  bool write = true;
  size_t size = 4096;
  int niov = 1;
  int nriov = 1;  // remote rma_iov count (pieces kRGap apart)
  uint64_t flags = FI_COMPLETION;
  size_t gap = 64;  // bytes between local iov pieces (non-contiguous gather/scatter)
};

size_t lslot(const OpSpec& s) { return s.size + size_t(s.niov) * s.gap; }

// Posts op i to remote slot (i % slots) from local slot (i % slots). Returns 0 or negative fi
// error.
int post(Init& in, const OpSpec& s, uint32_t i, uint32_t slots, uint64_t raddr_off, uint64_t key,
         long* reaped = nullptr) {
  uint32_t slot = i % slots;
  iovec iov[64];
  void* desc[64];
  size_t piece = s.size / s.niov;
  uint8_t* base = in.lbuf + size_t(slot) * lslot(s);
  for (int k = 0; k < s.niov; ++k) {
    iov[k].iov_base = base + k * (piece + s.gap);
    iov[k].iov_len = (k == s.niov - 1) ? s.size - piece * (s.niov - 1) : piece;
    desc[k] = fi_mr_desc(in.lmr);
  }
  fi_rma_iov rma[16]{};
  size_t rpiece = s.size / s.nriov;
  for (int k = 0; k < s.nriov; ++k) {
    rma[k].addr = in.h.addr + raddr_off + uint64_t(slot) * rstride(s.size, s.nriov) +
                  roff(s.size, s.nriov, k * rpiece);
    rma[k].len = (k == s.nriov - 1) ? s.size - rpiece * (s.nriov - 1) : rpiece;
    rma[k].key = key;
  }
  fi_msg_rma m{};
  m.msg_iov = iov;
  m.desc = desc;
  m.iov_count = size_t(s.niov);
  m.addr = in.peer;
  m.rma_iov = rma;
  m.rma_iov_count = size_t(s.nriov);
  m.context = &in.ctx[i % in.ctx.size()];
  double end = now_s() + 10;
  for (;;) {
    ssize_t r = s.write ? fi_writemsg(in.f.ep, &m, s.flags) : fi_readmsg(in.f.ep, &m, s.flags);
    if (r != -FI_EAGAIN) return int(r);
    in.eagain++;
    if (in.ignore_eagain) return 0;
    if (in.no_retry) return -FI_EAGAIN;
    if (now_s() > end) return -FI_ETIMEDOUT;
    fi_cq_data_entry e;  // drive progress; reaped completions are counted for the caller
    ssize_t c = fi_cq_read(in.f.cq, &e, 1);
    if (c == -FI_EAVAIL) {
      fi_cq_err_entry ee{};
      fi_cq_readerr(in.f.cq, &ee, 0);
      in.last_err = ee;
      in.err_entries++;
      c = 1;
    }
    if (c == 1) {
      if (!reaped) die("completion reaped during EAGAIN with no counter", -FI_EOTHER);
      ++*reaped;
    }
  }
}

void fill_local(Init& in, const OpSpec& s, uint32_t seed, uint32_t n) {
  size_t piece = s.size / s.niov;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t* base = in.lbuf + size_t(i) * lslot(s);
    size_t j = 0;
    for (int k = 0; k < s.niov; ++k) {
      size_t len = (k == s.niov - 1) ? s.size - piece * (s.niov - 1) : piece;
      uint8_t* p = base + k * (piece + s.gap);
      for (size_t q = 0; q < len; ++q, ++j) p[q] = s.write ? pat(seed, i, j) : 0;
    }
  }
}

// For reads: verify the local pieces.
void verify_local(Init& in, const OpSpec& s, uint32_t seed, uint32_t n, Resp& r) {
  size_t piece = s.size / s.niov;
  r.first_bad_op = -1;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t* base = in.lbuf + size_t(i) * lslot(s);
    size_t j = 0;
    int64_t b = 0;
    for (int k = 0; k < s.niov; ++k) {
      size_t len = (k == s.niov - 1) ? s.size - piece * (s.niov - 1) : piece;
      uint8_t* p = base + k * (piece + s.gap);
      for (size_t q = 0; q < len; ++q, ++j) b += p[q] != pat(seed, i, j);
    }
    if (b) {
      r.bad_ops++;
      if (r.first_bad_op < 0) r.first_bad_op = i;
    }
    r.bad_bytes += b;
  }
}

// One verification round: n ops, window w, all to distinct addresses. Returns bad bytes (-1: no
// completion).
Resp verify_round(Init& in, const OpSpec& s, uint32_t seed, uint32_t n, uint32_t w, bool flush) {
  Resp r{};
  cmd(in, kClear, 0, s.size, n, s.nriov);
  if (s.write) {
    fill_local(in, s, seed, n);
  } else {
    cmd(in, kFill, seed, s.size, n, s.nriov);
    fill_local(in, s, seed, n);
  }
  long outstanding = 0, done = 0;
  for (uint32_t i = 0; i < n; ++i) {
    while (outstanding >= long(w)) {
      long g = reap(in, 1, 10);
      if (!g) {
        r.bad_bytes = -1;
        return r;
      }
      outstanding -= g;
      done += g;
    }
    long reaped = 0;
    int rc = post(in, s, i, n, 0, in.h.key, &reaped);
    if (rc) die("post", rc);
    outstanding += 1 - reaped;
    done += reaped;
  }
  long fin = reap(in, outstanding, in.ignore_eagain ? 2 : 10);
  if (fin < outstanding && !in.ignore_eagain) {
    r.bad_bytes = -1;
    return r;
  }
  r.landed_ops = done + fin;  // completions seen
  if (flush && s.write) {     // a small read from the first slot, after all writes completed
    OpSpec fr;
    fr.write = false;
    fr.size = 8;
    int rc = post(in, fr, 4095, 1, 0, in.h.key);
    if (rc < 0) die("flush post", rc);
    if (reap(in, 1, 10) < 1) {
      r.bad_bytes = -1;
      return r;
    }
  }
  if (s.write) {
    int64_t seen = r.landed_ops;
    r = cmd(in, kVerify, seed, s.size, n, s.nriov);
    r.landed_ops = seen;
  } else
    verify_local(in, s, seed, n, r);
  return r;
}

uint64_t parse_flags(const std::string& f) {
  uint64_t fl = FI_COMPLETION;
  if (f.find("dc") != std::string::npos) fl |= FI_DELIVERY_COMPLETE;
  if (f.find("ic") != std::string::npos) fl |= FI_INJECT_COMPLETE;
  if (f.find("tc") != std::string::npos) fl |= FI_TRANSMIT_COMPLETE;
  return fl;
}

// verify PROV SIZES NIOVS WINDOWS FLAGS(dc|ic|tc|none)[+flush] ROUNDS
int cmd_verify(int argc, char** argv) {
  if (argc < 8) return 1;
  const char* prov = argv[2];
  std::vector<size_t> sizes;
  for (char* t = strtok(argv[3], ","); t; t = strtok(nullptr, ","))
    sizes.push_back(strtoull(t, nullptr, 0));
  std::vector<std::pair<int, int>> niovs;  // "L" or "LxR": local iovs x remote rma_iovs
  for (char* t = strtok(argv[4], ","); t; t = strtok(nullptr, ",")) {
    const char* x = strchr(t, 'x');
    niovs.push_back({atoi(t), x ? atoi(x + 1) : 1});
  }
  std::vector<int> ws;
  for (char* t = strtok(argv[5], ","); t; t = strtok(nullptr, ",")) ws.push_back(atoi(t));
  std::string fl = argv[6];
  bool flush = fl.find("flush") != std::string::npos;
  int rounds = atoi(argv[7]);
  Init in;
  in.ignore_eagain = fl.find("ignoreeagain") != std::string::npos;
  if (!start(in, prov)) return 2;
  const char* env = getenv("FI_SHM_DISABLE_CMA");
  for (int wr = 1; wr >= 0; --wr)
    for (size_t sz : sizes)
      for (auto [ni, nri] : niovs)
        for (int w : ws) {
          OpSpec s;
          s.write = wr;
          s.size = sz;
          s.niov = ni;
          s.nriov = nri;
          s.flags = parse_flags(fl);
          uint32_t n = uint32_t(std::max(w, 1));
          while (size_t(n) * rstride(sz, nri) > (32u << 20) && n > 1) n /= 2;
          int64_t bad = 0, badops = 0, fails = 0, comps = 0;
          in.eagain = 0;
          for (int rd = 0; rd < rounds; ++rd) {
            Resp r = verify_round(in, s, 1000 + rd * 7 + uint32_t(sz), n, uint32_t(w), flush);
            if (r.bad_bytes < 0) {
              fails++;
              break;
            }
            bad += r.bad_bytes;
            badops += r.bad_ops;
            comps += r.landed_ops;
          }
          std::printf(
              "VERIFY prov=%s cma_disabled=%s %s size=%zu niov=%s inflight=%d flags=%s rounds=%d "
              "ops/round=%u -> %s "
              "bad_bytes=%lld bad_ops=%lld errs=%ld completions=%lld eagain=%ld%s\n",
              prov, env ? env : "unset", wr ? "write" : "read", sz,
              (std::to_string(ni) + "x" + std::to_string(nri)).c_str(), w, fl.c_str(), rounds, n,
              (bad == 0 && fails == 0) ? "OK" : "CORRUPT", (long long)bad, (long long)badops,
              in.err_entries, (long long)comps, in.eagain, fails ? " TIMEOUT" : "");
          std::fflush(stdout);
          if (fails) {
            kill(in.child, SIGKILL);
            return 4;
          }
        }
  stop(in);
  return 0;
}

// bench PROV write|read SIZES WINDOWS NIOV FLAGS SECONDS REPS
int cmd_bench(int argc, char** argv) {
  if (argc < 10) return 1;
  const char* prov = argv[2];
  bool wr = std::string(argv[3]) == "write";
  std::vector<size_t> sizes;
  for (char* t = strtok(argv[4], ","); t; t = strtok(nullptr, ","))
    sizes.push_back(strtoull(t, nullptr, 0));
  std::vector<int> ws;
  for (char* t = strtok(argv[5], ","); t; t = strtok(nullptr, ",")) ws.push_back(atoi(t));
  int niov = atoi(argv[6]);  // "L" or "LxR"
  const char* xr = strchr(argv[6], 'x');
  int nriov = xr ? atoi(xr + 1) : 1;
  uint64_t flags = parse_flags(argv[7]);
  double secs = atof(argv[8]);
  int reps = atoi(argv[9]);
  Init in;
  if (!start(in, prov)) return 2;
  for (size_t sz : sizes)
    for (int w : ws) {
      OpSpec s;
      s.write = wr;
      s.size = sz;
      s.niov = niov;
      s.nriov = nriov;
      s.flags = flags;
      uint32_t slots = uint32_t(w);
      while (size_t(slots) * rstride(sz, nriov) > (32u << 20) && slots > 1) slots /= 2;
      std::vector<double> gbs;
      for (int rp = 0; rp < reps; ++rp) {
        long outstanding = 0, done = 0;
        uint32_t i = 0;
        double t0 = now_s(), end = t0 + secs;
        while (now_s() < end) {
          while (outstanding < w &&
                 now_s() < end) {  // posts can reap completions (EAGAIN): check time here too
            long reaped = 0;
            int rc = post(in, s, i++, slots, 0, in.h.key, &reaped);
            if (rc == -FI_ETIMEDOUT) {
              std::printf(
                  "BENCH-STALL prov=%s %s size=%zu inflight=%d: -FI_EAGAIN for 10 s on a post; %ld "
                  "done, %ld "
                  "outstanding, %ld EAGAIN\n",
                  prov, wr ? "write" : "read", sz, w, done + reaped, outstanding - reaped,
                  in.eagain);
              std::fflush(stdout);
              kill(in.child, SIGKILL);
              _exit(5);
            }
            if (rc) die("post", rc);
            outstanding += 1 - reaped;
            done += reaped;
          }
          long g = outstanding > 0 ? reap(in, 1, 10) : 1;
          if (!g) {
            std::printf(
                "BENCH-STALL prov=%s %s size=%zu inflight=%d: no completion in 10 s; %ld done, %ld "
                "outstanding, "
                "%ld EAGAIN\n",
                prov, wr ? "write" : "read", sz, w, done, outstanding, in.eagain);
            std::fflush(stdout);
            kill(in.child, SIGKILL);
            _exit(5);
          }
          if (outstanding > 0) {
            outstanding -= g;
            done += g;
          }
        }
        done += reap(in, outstanding, 10);
        double t = now_s() - t0;
        gbs.push_back(double(done) * sz / t / 1e9);
      }
      std::sort(gbs.begin(), gbs.end());
      std::printf(
          "BENCH prov=%s %s size=%zu inflight=%d niov=%s flags=%s median_GBps=%.3f min=%.3f "
          "max=%.3f errs=%ld "
          "eagain=%ld\n",
          prov, wr ? "write" : "read", sz, w, argv[6], argv[7], gbs[gbs.size() / 2], gbs.front(),
          gbs.back(), in.err_entries, in.eagain);
      in.eagain = 0;
      std::fflush(stdout);
    }
  stop(in);
  return 0;
}

// order PROV SIZE PAUSE_MS FLAGS N : when a write completes at the initiator, are its bytes already
// in the target's memory? The target drives no progress for PAUSE_MS (it sleeps), then polls again.
// The initiator checks the target's memory (a shared mapping) at the moment each completion
// arrives.
int cmd_order(int argc, char** argv) {
  if (argc < 7) return 1;
  const char* prov = argv[2];
  OpSpec s;
  s.size = strtoull(argv[3], nullptr, 0);
  int pause_ms = atoi(argv[4]);
  s.flags = parse_flags(argv[5]);
  uint32_t n = uint32_t(atoi(argv[6]));
  Init in;
  if (!start(in, prov)) return 2;
  verify_round(in, s, 5, 1, 1, false);  // connect
  cmd(in, kClear, 0, s.size, n);
  fill_local(in, s, 77, n);
  Cmd c{kPause, 0, 0, 0, pause_ms};
  xwrite(in.sock, &c, sizeof(c));
  usleep(5000);
  double t0 = now_s();
  long reaped = 0;
  for (uint32_t i = 0; i < n; ++i) {
    int rc = post(in, s, i, n, 0, in.h.key, &reaped);
    if (rc < 0) die("post", rc);
  }
  long got = 0, early = 0;
  double first = -1, last = -1;
  double end = now_s() + 15;
  while (got + reaped < long(n) && now_s() < end) {
    fi_cq_data_entry e[64];
    ssize_t r = fi_cq_read(in.f.cq, e, 64);
    if (r == -FI_EAVAIL) {
      fi_cq_err_entry ee{};
      fi_cq_readerr(in.f.cq, &ee, 0);
      in.err_entries++;
      got++;
      continue;
    }
    if (r <= 0) continue;
    double t = now_s() - t0;
    if (first < 0) first = t;
    last = t;
    for (ssize_t k = 0; k < r; ++k) {
      size_t i = static_cast<fi_context2*>(e[k].op_context) - in.ctx.data();
      const uint8_t* p = in.tbuf + i * s.size;
      bool ok = true;
      for (size_t j = 0; j < s.size && ok; ++j) ok = p[j] == pat(77, uint32_t(i), j);
      early += !ok;
    }
    got += r;
  }
  Resp rr{};
  xread(in.sock, &rr, sizeof(rr), 20000);
  std::printf(
      "ORDER prov=%s size=%zu n=%u flags=%s target_sleeps_ms=%d: completions=%ld (reaped while "
      "posting %ld, errors %ld) "
      "first_at=%.1fms last_at=%.1fms; ops whose bytes were NOT yet in target memory at "
      "completion: %ld\n",
      prov, s.size, n, argv[5], pause_ms, got, reaped, in.err_entries, first * 1e3, last * 1e3,
      early);
  stop(in);
  return 0;
}

void print_err(Init& in, const char* what, int post_rc, long got) {
  if (post_rc < 0) {
    std::printf("ERR %s: post returned %d (%s)\n", what, post_rc, fi_strerror(-post_rc));
  } else if (got == 0) {
    std::printf("ERR %s: no completion within 5 s\n", what);
  } else if (in.last_err.err) {
    char buf[256] = {};
    const char* ps =
        fi_cq_strerror(in.f.cq, in.last_err.prov_errno, in.last_err.err_data, buf, sizeof(buf));
    std::printf("ERR %s: CQ error entry err=%d (%s) prov_errno=%d prov_str=\"%s\"\n", what,
                in.last_err.err, fi_strerror(in.last_err.err), in.last_err.prov_errno,
                ps ? ps : "");
  } else {
    std::printf("ERR %s: completed with SUCCESS (no error reported)\n", what);
  }
  in.last_err = {};
  std::fflush(stdout);
}

// errors PROV write|read CASE SIZE FLAGS: one bad RMA on a fresh connection. The target registers
// its buffer minus 1 MiB guards at both ends, so a spill outside the MR lands in the guards, which
// the initiator can see (shared mapping). CASE: inside | beyond (half past the end) | below (half
// before the start) | wrongkey | closed (the target closed the MR before the op).
int cmd_errors(int argc, char** argv) {
  if (argc < 7) return 1;
  const char* prov = argv[2];
  OpSpec s;
  s.write = std::string(argv[3]) == "write";
  std::string cs = argv[4];
  s.size = strtoull(argv[5], nullptr, 0);
  s.flags = parse_flags(argv[6]);
  Init in;
  if (!start(in, prov)) return 2;
  OpSpec w1;
  verify_round(in, w1, 5, 1, 1, false);  // connect
  Resp sub = cmd(in, kRegSub, 0, 0, 0);
  in.h.addr = uint64_t(sub.bad_bytes);
  uint64_t key = uint64_t(sub.bad_ops);
  size_t inner = kTargetBytes - 2 * kGuard;
  std::memset(in.tbuf, 0, kTargetBytes);
  for (size_t j = 0; j < s.size; ++j) in.lbuf[j] = s.write ? pat(9, 0, j) : 0;
  if (!s.write) {  // guards 0xEE (what a bad read would fetch), the MR 0x11
    std::memset(in.tbuf, 0xEE, kGuard);
    std::memset(in.tbuf + kTargetBytes - kGuard, 0xEE, kGuard);
    std::memset(in.tbuf + kGuard, 0x11, inner);
  }
  uint64_t off = 0;
  if (cs == "beyond") off = inner - s.size / 2;
  if (cs == "below") off = uint64_t(0) - s.size / 2;
  if (cs == "wrongkey") key += 777;
  if (cs == "closed") cmd(in, kCloseMr, 0, 0, 0);
  in.last_err = {};
  double t0 = now_s();
  int rc = post(in, s, 0, 1, off, key);
  long got = rc == 0 ? reap(in, 1, 5) : 0;
  double dt = now_s() - t0;
  char what[160];
  std::snprintf(what, sizeof what, "prov=%s %s %s size=%zu flags=%s (%.1f ms)", prov, argv[3],
                cs.c_str(), s.size, argv[6], dt * 1e3);
  print_err(in, what, rc, got);
  usleep(200000);
  size_t spill = 0, landed = 0;
  if (s.write) {
    for (size_t j = 0; j < kGuard; ++j) spill += in.tbuf[j] != 0;
    for (size_t j = kTargetBytes - kGuard; j < kTargetBytes; ++j) spill += in.tbuf[j] != 0;
    for (size_t j = kGuard; j < kTargetBytes - kGuard; ++j) landed += in.tbuf[j] != 0;
  } else {
    for (size_t j = 0; j < s.size; ++j) {
      landed += in.lbuf[j] != 0 && in.lbuf[j] != 0xEE;
      spill += in.lbuf[j] == 0xEE;
    }
  }
  std::printf("  -> %s: %zu bytes from inside the MR, %zu bytes from OUTSIDE the MR (guards)\n",
              s.write ? "target memory written" : "initiator buffer got", landed, spill);
  std::printf("  -> the connection afterwards: ");
  OpSpec g;
  in.last_err = {};
  in.h.addr = uint64_t(sub.bad_bytes);
  int rc2 = cs == "closed" ? -1 : post(in, g, 0, 1, 0, uint64_t(sub.bad_ops));
  long got2 = rc2 == 0 ? reap(in, 1, 5) : 0;
  if (cs == "closed")
    std::printf("(not tried)\n");
  else if (rc2)
    std::printf("post rc=%d %s\n", rc2, fi_strerror(-rc2));
  else if (!got2)
    std::printf("no completion in 5 s\n");
  else
    std::printf("%s\n",
                in.last_err.err ? fi_strerror(in.last_err.err) : "a good write completes OK");
  std::fflush(stdout);
  kill(in.child, SIGKILL);
  return 0;
}

// kill PROV write|read SIZE N TIMEOUT_S: SIGKILL the target with N ops in flight.
int cmd_kill(int argc, char** argv) {
  if (argc < 7) return 1;
  const char* prov = argv[2];
  OpSpec s;
  s.write = std::string(argv[3]) == "write";
  s.size = strtoull(argv[4], nullptr, 0);
  uint32_t n = uint32_t(atoi(argv[5]));
  double tmo = atof(argv[6]);
  s.flags = parse_flags(argc > 7 ? argv[7] : "none");
  Init in;
  if (!start(in, prov)) return 2;
  verify_round(in, s, 5, 1, 1, false);  // connect
  in.no_retry = true;
  // Stop the target's progress (it sleeps in kPause), post, kill it.
  Cmd c{kPause, 0, 0, 0, 5000};
  xwrite(in.sock, &c, sizeof(c));
  usleep(20000);
  uint32_t posted = 0;
  for (uint32_t i = 0; i < n; ++i) {
    int rc = post(in, s, i, n, 0, in.h.key);
    if (rc == -FI_EAGAIN) break;
    if (rc < 0) die("post", rc);
    ++posted;
  }
  n = posted;
  kill(in.child, SIGKILL);
  int st;
  waitpid(in.child, &st, 0);
  double t0 = now_s();
  std::vector<double> times;
  long ok_before = 0;
  reap(in, n, tmo, &times);
  ok_before = long(times.size()) - in.err_entries;
  std::printf(
      "KILL prov=%s %s size=%zu flags=%s posted=%u (until EAGAIN): within %.0fs got %zu entries "
      "(%ld errors, %ld success)",
      prov, s.write ? "write" : "read", s.size, argc > 7 ? argv[7] : "none", n, tmo, times.size(),
      in.err_entries, ok_before);
  if (!times.empty())
    std::printf(" first at %.1fms last at %.1fms", (times.front() - t0) * 1e3,
                (times.back() - t0) * 1e3);
  std::printf("\n");
  if (in.err_entries) print_err(in, "kill: last error", 0, 1);
  // A new op after the death.
  in.err_entries = 0;
  in.no_retry = false;
  int rc = post(in, s, 0, 1, 0, in.h.key);
  long got = rc == 0 ? reap(in, 1, tmo) : 0;
  print_err(in, "kill: new op after death", rc, got);
  return 0;  // no close: the endpoint may hang on a dead peer
}

void print_info_one(const char* prov, fi_info* i) {
  uint64_t m = i->domain_attr->mr_mode;
  std::printf("INFO prov=%s fabric=%s domain=%s\n", prov, i->fabric_attr->prov_name,
              i->domain_attr->name);
  std::printf("  mr_mode=0x%llx:%s%s%s%s%s%s%s mr_key_size=%zu\n", (unsigned long long)m,
              m & FI_MR_LOCAL ? " LOCAL" : "", m & FI_MR_VIRT_ADDR ? " VIRT_ADDR" : "",
              m & FI_MR_ALLOCATED ? " ALLOCATED" : "", m & FI_MR_PROV_KEY ? " PROV_KEY" : "",
              m & FI_MR_ENDPOINT ? " ENDPOINT" : "", m & FI_MR_RAW ? " RAW" : "",
              m & FI_MR_HMEM ? " HMEM" : "", i->domain_attr->mr_key_size);
  std::printf(
      "  tx: iov_limit=%zu rma_iov_limit=%zu inject_size=%zu size=%zu op_flags=0x%llx "
      "msg_order=0x%llx\n",
      i->tx_attr->iov_limit, i->tx_attr->rma_iov_limit, i->tx_attr->inject_size, i->tx_attr->size,
      (unsigned long long)i->tx_attr->op_flags, (unsigned long long)i->tx_attr->msg_order);
  std::printf(
      "  rx: size=%zu iov_limit=%zu; ep max_msg_size=%zu max_order_raw=%zu max_order_war=%zu "
      "max_order_waw=%zu\n",
      i->rx_attr->size, i->rx_attr->iov_limit, i->ep_attr->max_msg_size,
      i->ep_attr->max_order_raw_size, i->ep_attr->max_order_war_size,
      i->ep_attr->max_order_waw_size);
  std::printf(
      "  cq_data_size=%zu data_progress=%s control_progress=%s threading=%d caps=0x%llx "
      "mode=0x%llx\n",
      i->domain_attr->cq_data_size, fi_tostr(&i->domain_attr->data_progress, FI_TYPE_PROGRESS),
      fi_tostr(&i->domain_attr->control_progress, FI_TYPE_PROGRESS), i->domain_attr->threading,
      (unsigned long long)i->caps, (unsigned long long)i->mode);
}

int cmd_info(int argc, char** argv) {
  if (argc < 3) return 1;
  const char* prov = argv[2];
  fi_info* h = make_hints(prov);
  fi_info* out = nullptr;
  int rc = get_info(prov, h, &out);
  if (rc) die("fi_getinfo", rc);
  int k = 0;
  for (fi_info* i = out; i; i = i->next) ++k;
  std::printf("fi_getinfo returned %d entries; the first:\n", k);
  print_info_one(prov, out);
  fi_freeinfo(out);
  // tx op_flags FI_DELIVERY_COMPLETE in hints.
  h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  rc = get_info(prov, h, &out);
  std::printf("  hints tx_attr->op_flags=FI_DELIVERY_COMPLETE: fi_getinfo rc=%d (%s)%s\n", rc,
              fi_strerror(-rc),
              rc == 0 && (out->tx_attr->op_flags & FI_DELIVERY_COMPLETE)
                  ? " returned op_flags has DC"
                  : "");
  if (!rc) fi_freeinfo(out);
  h->tx_attr->op_flags = 0;
  for (auto [pg, nm] :
       {std::pair{FI_PROGRESS_AUTO, "AUTO"}, std::pair{FI_PROGRESS_MANUAL, "MANUAL"}}) {
    h->domain_attr->data_progress = pg;
    rc = get_info(prov, h, &out);
    std::printf("  hints data_progress=%s: rc=%d%s\n", nm, rc,
                rc ? (std::string(" ") + fi_strerror(-rc)).c_str() : "");
    if (!rc) fi_freeinfo(out);
  }
  h->domain_attr->data_progress = FI_PROGRESS_UNSPEC;
  h->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  rc = get_info(prov, h, &out);
  std::printf(
      "  hints mr_mode=VIRT_ADDR|ALLOCATED|PROV_KEY (no LOCAL/ENDPOINT): rc=%d -> mr_mode=0x%llx\n",
      rc, rc ? 0ull : (unsigned long long)out->domain_attr->mr_mode);
  if (!rc) fi_freeinfo(out);
  h->domain_attr->mr_mode = 0;
  rc = get_info(prov, h, &out);
  std::printf("  hints mr_mode=0: rc=%d -> mr_mode=0x%llx\n", rc,
              rc ? 0ull : (unsigned long long)out->domain_attr->mr_mode);
  if (!rc) fi_freeinfo(out);
  fi_freeinfo(h);
  // CQ wait objects (for an epoll-based wait).
  {
    fi_info* hh = make_hints(prov);
    fi_info* fi = nullptr;
    CK(get_info(prov, hh, &fi));
    fid_fabric* fab;
    fid_domain* dom;
    CK(fi_fabric(fi->fabric_attr, &fab, nullptr));
    CK(fi_domain(fab, fi, &dom, nullptr));
    for (auto [wo, nm] : {std::pair{FI_WAIT_FD, "FD"}, std::pair{FI_WAIT_UNSPEC, "UNSPEC"}}) {
      fi_cq_attr ca{};
      ca.format = FI_CQ_FORMAT_DATA;
      ca.wait_obj = wo;
      fid_cq* cq = nullptr;
      rc = fi_cq_open(dom, &ca, &cq, nullptr);
      std::printf("  CQ wait_obj=%s: fi_cq_open rc=%d (%s)", nm, rc, fi_strerror(-rc));
      if (!rc) {
        int fd = -1;
        int r2 = fi_control(&cq->fid, FI_GETWAIT, &fd);
        std::printf("; FI_GETWAIT rc=%d (%s) fd=%d", r2, fi_strerror(-r2), fd);
        if (r2) {  // fi_trywait/fi_cq_sread crash (null call) on shm here; skip them
          fi_close(&cq->fid);
          std::printf("\n");
          continue;
        }
        fid* fids[1] = {&cq->fid};
        r2 = fi_trywait(fab, fids, 1);
        std::printf("; fi_trywait rc=%d (%s)", r2, fi_strerror(-r2));
        fi_cq_data_entry e;
        double t = now_s();
        r2 = int(fi_cq_sread(cq, &e, 1, nullptr, 50));
        std::printf("; fi_cq_sread(50ms) rc=%d after %.0fms", r2, (now_s() - t) * 1e3);
        fi_close(&cq->fid);
      }
      std::printf("\n");
    }
    fi_close(&dom->fid);
    fi_close(&fab->fid);
    fi_freeinfo(fi);
    fi_freeinfo(hh);
  }
  // Per-op DELIVERY_COMPLETE accepted? (one write to a live target)
  {
    Init in;
    if (!start(in, prov)) return 2;
    for (const char* fl : {"dc", "ic", "tc", "none"}) {
      OpSpec s;
      s.flags = parse_flags(fl);
      int prc = post(in, s, 0, 1, 0, in.h.key);
      long got = prc == 0 ? reap(in, 1, 5) : 0;
      std::printf("  per-op flags=%s on fi_writemsg: post rc=%d (%s), completion %s\n", fl, prc,
                  fi_strerror(-prc), got ? (in.last_err.err ? "ERROR" : "ok") : "none");
      in.last_err = {};
    }
    stop(in);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  alarm(900);  // hard bound on any run
  std::string m = argc > 1 ? argv[1] : "help";
  int rc = 1;
  if (m == "info")
    rc = cmd_info(argc, argv);
  else if (m == "verify")
    rc = cmd_verify(argc, argv);
  else if (m == "bench")
    rc = cmd_bench(argc, argv);
  else if (m == "order")
    rc = cmd_order(argc, argv);
  else if (m == "errors")
    rc = cmd_errors(argc, argv);
  else if (m == "kill")
    rc = cmd_kill(argc, argv);
  if (rc == 1)
    std::fprintf(stderr,
                 "usage:\n  probe info PROV\n  probe verify PROV SIZES NIOVS INFLIGHTS "
                 "FLAGS[+flush] ROUNDS\n"
                 "  probe bench PROV write|read SIZES INFLIGHTS NIOV FLAGS SECONDS REPS\n"
                 "  probe order PROV SIZE TARGET_PAUSE_MS FLAGS N\n  probe errors PROV write|read "
                 "inside|beyond|below|wrongkey|closed SIZE FLAGS\n"
                 "  probe kill PROV write|read SIZE N TIMEOUT_S [FLAGS]\n"
                 "PROV: tcp | \"tcp;ofi_rxm\" | shm; FLAGS: dc, ic, tc, none (comma-free combos "
                 "like dc+flush)\n");
  std::fflush(stdout);
  _exit(rc);
}
