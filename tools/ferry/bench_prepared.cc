// --prepared: each thread's batch as prepared descriptor lists and one
// prepared transfer per opcode, posted again every iteration; and the time
// to prepare 1 M rows.
#include <algorithm>
#include <chrono>

#include "bench_phase.h"
#include "pattern.h"

namespace ferry::bench {

// Thread t's rows (from its slot layout), its local and remote list, and one
// transfer per opcode whose index pairs are the batch's entries. Throws
// cli::RunError.
void Phase::SetUpPrepared(int t, Local& L) {
  Engine& engine = *s_.engine;
  const Layout& layout = w_.layouts[t];
  const auto& entries = w_.batches[t];
  auto t0 = Clock::now();
  std::vector<DescRow> local_rows =
      SlotRows(layout.local, reinterpret_cast<uintptr_t>(s_.local->data()));
  std::vector<DescRow> remote_rows = SlotRows(layout.remote, s_.remote_base);
  // [0]: writes, [1]: reads, in the batch's order.
  std::vector<uint32_t> local_index[2], remote_index[2];
  for (size_t i = 0; i < entries.size(); ++i) {
    const int k = entries[i].opcode == Opcode::kWrite ? 0 : 1;
    local_index[k].push_back(layout.local_index[i]);
    remote_index[k].push_back(layout.remote_index[i]);
  }
  auto t1 = Clock::now();
  auto local = engine.PrepareLocalList(local_rows);
  auto t2 = Clock::now();
  if (!local.ok()) {
    Fail("PrepareLocalList (" + std::to_string(local_rows.size()) + " rows)", local.status());
  }
  L.local_list = *local;
  auto remote = engine.PrepareRemoteList(s_.segment, remote_rows);
  auto t3 = Clock::now();
  if (!remote.ok()) {
    Fail("PrepareRemoteList (" + std::to_string(remote_rows.size()) + " rows)", remote.status());
  }
  L.remote_list = *remote;
  for (int k = 0; k < 2; ++k) {
    if (local_index[k].empty()) continue;
    auto tr = engine.MakeTransfer(k == 0 ? Opcode::kWrite : Opcode::kRead, *local, local_index[k],
                                  *remote, remote_index[k]);
    if (!tr.ok()) {
      Fail("MakeTransfer (" + std::to_string(local_index[k].size()) + " pairs)", tr.status());
    }
    L.transfers.push_back(*tr);
  }
  auto t4 = Clock::now();
  L.rows_ms = Millis(t1 - t0);
  L.local_list_ms = Millis(t2 - t1);
  L.remote_list_ms = Millis(t3 - t2);
  L.make_ms = Millis(t4 - t3);
  L.local_rows = local_rows.size();
  L.remote_rows = remote_rows.size();
}

void Phase::TearDownPrepared(Local& L) {
  Engine& engine = *s_.engine;
  for (TransferHandle h : L.transfers) engine.ReleaseTransfer(h).IgnoreError();
  if (L.local_list) engine.ReleaseDescList(*L.local_list).IgnoreError();
  if (L.remote_list) engine.ReleaseDescList(*L.remote_list).IgnoreError();
}

// One iteration: every transfer posted, then each waited for.
bool Phase::RunPrepared(int t, Local& L, bool record) {
  const auto& entries = w_.batches[t];
  Engine& engine = *s_.engine;
  const uint64_t seed = Mix64((static_cast<uint64_t>(t) + 1) << 40 | L.iteration);
  const size_t n = entries.size();
  if (o_.verify) Prepare(t, L, 0, n, seed);
  auto t0 = Clock::now();
  Status st;
  size_t posted = 0;
  for (; posted < L.transfers.size() && st.ok(); ++posted) {
    st = engine.PostTransfer(L.transfers[posted]);
  }
  if (!st.ok()) --posted;
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      s_.engine->options().transfer_timeout + std::chrono::seconds(10));
  for (size_t i = 0; i < posted; ++i) {
    Status w = engine.WaitTransfer(L.transfers[i], timeout);
    if (st.ok()) st = w;
  }
  double us = Micros(Clock::now() - t0);
  if (!st.ok()) {
    SetError("prepared transfer of " + std::to_string(n) + " requests failed: " + st.ToString());
    return false;
  }
  if (o_.verify) Check(t, L, 0, n, seed);
  ++L.iteration;
  if (record) Record(t, L, n, us, false);
  return true;
}

PrepareMicro RunPrepareMicro(Session& s) {
  PrepareMicro m;
  m.local_row_bytes = std::min(kMicroRowBytes, s.local->length() / kMicroRows);
  m.remote_row_bytes = std::min(kMicroRowBytes, s.remote_length / kMicroRows);
  if (m.local_row_bytes == 0 || m.remote_row_bytes == 0) return m;
  m.rows = kMicroRows;
  auto rows_of = [](uint64_t base, uint64_t len) {
    std::vector<DescRow> rows(kMicroRows);
    for (uint64_t i = 0; i < kMicroRows; ++i) rows[i] = {base + i * len, len, 0, 1};
    return rows;
  };
  std::vector<double> build, local, remote;
  for (int round = 0; round < 3; ++round) {
    auto t0 = Clock::now();
    std::vector<DescRow> lrows =
        rows_of(reinterpret_cast<uintptr_t>(s.local->data()), m.local_row_bytes);
    auto t1 = Clock::now();
    std::vector<DescRow> rrows = rows_of(s.remote_base, m.remote_row_bytes);
    auto t2 = Clock::now();
    auto l = s.engine->PrepareLocalList(lrows);
    auto t3 = Clock::now();
    if (!l.ok()) Fail("PrepareLocalList of 1 M rows", l.status());
    auto r = s.engine->PrepareRemoteList(s.segment, rrows);
    auto t4 = Clock::now();
    if (!r.ok()) Fail("PrepareRemoteList of 1 M rows", r.status());
    s.engine->ReleaseDescList(*l).IgnoreError();
    s.engine->ReleaseDescList(*r).IgnoreError();
    build.push_back(Millis(t1 - t0));
    local.push_back(Millis(t3 - t2));
    remote.push_back(Millis(t4 - t3));
  }
  m.build_ms = Median(build);
  m.local_ms = Median(local);
  m.remote_ms = Median(remote);
  return m;
}

}  // namespace ferry::bench
