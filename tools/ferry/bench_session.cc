#include "bench_session.h"

#include <cstdio>
#include <exception>
#include <vector>

#include "cli.h"
#include "net.h"

namespace ferry::bench {

Session::~Session() {
  if (engine && local) engine->UnregisterMemory(local->data()).IgnoreError();
  engine.reset();
  control.reset();
  if (target_control) target_control->Stop();
  target_engine.reset();
}

namespace {

// Whether `text` is a peer id: HOST:PORT or [IPV6]:PORT.
bool IsHostPort(const std::string& text) {
  std::string host;
  uint16_t port = 0;
  try {
    SplitHostPort("--target", text, &host, &port);
    return true;
  } catch (const cli::UsageError&) {
    return false;
  }
}

// The name the target at `control_addr` published ("" when there is no
// control address, the target published none, or it cannot be asked).
std::string NameFromControl(const std::string& control_addr) {
  if (control_addr.empty()) return "";
  try {
    std::string host;
    uint16_t port = 0;
    SplitHostPort("--control", control_addr, &host, &port);
    return ControlClient(host, port).TargetName();
  } catch (const std::exception&) {
    return "";  // the caller names what to do without it
  }
}

// With a metadata service the target is found by the name it published, not
// by its peer id. For a `target` given as HOST:PORT anyway (`why` is why it
// was not found under that name), looks under the name the target's control
// port reports and under the default name for the engine whose peer id is
// `target`. Returns its segment, or throws cli::RunError naming the name to
// use.
SegmentHandle FindByPeerId(Engine& engine, const BenchOptions& o, const std::string& target,
                           const std::string& control_addr, const Status& why) {
  const std::string told = NameFromControl(control_addr);
  std::vector<std::string> names;
  if (!told.empty()) names.push_back(told);
  if (told != kDefaultTargetName) names.push_back(kDefaultTargetName);
  for (const std::string& name : names) {
    auto seg = engine.OpenSegment(name);
    if (!seg.ok()) continue;
    auto info = engine.DescribeSegment(*seg);
    if (info.ok() && info->peer_id == target) {
      std::fprintf(stderr,
                   "ferry bench: %s is the target published as '%s' in %s; using that name "
                   "(pass --target %s)\n",
                   target.c_str(), name.c_str(), o.metadata.c_str(), name.c_str());
      return *seg;
    }
    engine.CloseSegment(*seg).IgnoreError();
  }
  const std::string use =
      told.empty()
          ? std::string("the name it published (its first line, 'name NAME'; ") +
                kDefaultTargetName + " unless it was started with --name)"
          : "'" + told + "' (the name the target at --control " + control_addr + " published)";
  throw cli::RunError("cannot open the target's segment " + target + ": " + why.ToString() +
                      "; with --metadata the initiator names the target by " + use +
                      ", not by its HOST:PORT: pass --target NAME");
}

// The target's segment: `target` as given, or, under a metadata service, the
// engine whose peer id `target` is (see FindByPeerId).
SegmentHandle OpenTarget(Engine& engine, const BenchOptions& o, const std::string& target,
                         const std::string& control_addr) {
  auto seg = engine.OpenSegment(target);
  if (seg.ok()) return *seg;
  if (o.ByName() && IsHostPort(target)) {
    return FindByPeerId(engine, o, target, control_addr, seg.status());
  }
  Fail("cannot open the target's segment " + target, seg.status());
}

// The target's buffer: the largest region it registered (the bench target
// registers one).
void UseLargestRegion(Session& s, const std::string& target) {
  if (s.info.regions.empty()) {
    throw cli::RunError("the target " + target + " has registered no memory");
  }
  const RemoteRegion* best = &s.info.regions[0];
  for (const RemoteRegion& r : s.info.regions) {
    if (r.length > best->length) best = &r;
  }
  s.remote_base = best->addr;
  s.remote_length = best->length;
}

// Connects to `control_addr`, or else to the control port the target
// advertises in its segment name (",control=HOST:PORT"); none: no control.
void ConnectControl(Session& s, const std::string& control_addr) {
  std::string control = control_addr;
  if (control.empty()) {
    auto pos = s.info.engine_name.find("control=");
    if (pos != std::string::npos) control = s.info.engine_name.substr(pos + 8);
  }
  if (control.empty()) return;
  SplitHostPort("--control", control, &s.control_host, &s.control_port);
  s.control = std::make_unique<ControlClient>(s.control_host, s.control_port);
  s.have_control = true;
}

}  // namespace

void OpenSession(Session& s, const BenchOptions& o, const std::string& target,
                 const std::string& control_addr, uint64_t local_bytes) {
  auto engine = Engine::Create(o.MakeEngineOptions());
  if (!engine.ok()) Fail("cannot start the engine", engine.status());
  s.engine = std::move(*engine);
  s.segment = OpenTarget(*s.engine, o, target, control_addr);
  auto info = s.engine->QuerySegment(s.segment);
  if (!info.ok()) Fail("cannot query the target's segment " + target, info.status());
  s.info = *info;
  UseLargestRegion(s, target);
  ConnectControl(s, control_addr);

  s.hugepages = o.hugepages;
  s.local = std::make_unique<Buffer>(local_bytes, true, o.hugepages, o.local_shared);
  Status st = s.engine->RegisterMemory(s.local->data(), s.local->length(), "cpu:0");
  if (!st.ok()) Fail("cannot register the local buffer", st);
}

}  // namespace ferry::bench
