#include "bench_session.h"

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

// The target's segment. Throws cli::RunError.
SegmentHandle OpenTarget(Engine& engine, const std::string& target) {
  auto seg = engine.OpenSegment(target);
  if (!seg.ok()) Fail("cannot open the target's segment " + target, seg.status());
  return *seg;
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
  s.segment = OpenTarget(*s.engine, target);
  auto info = s.engine->QuerySegment(s.segment);
  if (!info.ok()) Fail("cannot query the target's segment " + target, info.status());
  s.info = *info;
  UseLargestRegion(s, target);
  ConnectControl(s, control_addr);

  s.hugepages = o.hugepages;
  s.local = std::make_unique<Buffer>(local_bytes, true, o.hugepages);
  Status st = s.engine->RegisterMemory(s.local->data(), s.local->length(), "cpu:0");
  if (!st.ok()) Fail("cannot register the local buffer", st);
}

}  // namespace ferry::bench
