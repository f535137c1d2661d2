// The fuzz targets: one function per family of decoders of bytes that come
// from outside the process (a peer's frames, a metadata store's values and
// replies). Each libFuzzer binary (fuzz_<name>, target_main.cc) runs one of
// them; wire_fuzz_replay (replay_main.cc) runs all of them over the seeds
// of seeds.cc, their mutations and the files in regressions/<name>/.
//
// Every function returns normally on any input. A decoder that crashes,
// reads out of bounds (ASan), hits undefined behaviour (UBSan), or breaks a
// property checked here (what decodes re-encodes to the same bytes, errors
// name what was being read) aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::fuzz {

// The first byte of an input picks a decoder of the family (modulo their
// number), the rest is that decoder's input.
void FuzzFrames(std::string_view in);  // frame header, bodies, FrameReader, ExchangeFrame
void FuzzDescriptor(
    std::string_view in);  // descriptor, handshake response, version negotiation, peer ids
void FuzzAuth(std::string_view in);        // AuthHello, AuthChallenge, AuthProof bodies
void FuzzCopyFrames(std::string_view in);  // shm's CopyEntryList, CopyHello; fabric's messages
// The slot table of mapped segments that same-host peers write
// (slot_fuzz.cc): lookups, mappings and range translation.
void FuzzSlotTable(std::string_view in);
// The request rings of same-host streams, whose positions and flags the
// peer writes (ring_fuzz.cc): reads and writes against scribbled state.
void FuzzRequestRing(std::string_view in);
void FuzzStoreEntries(
    std::string_view in);  // a store's value: DecodeEntry raw/base64, CheckClaim, keys
#ifdef FERRY_FUZZ_STORES
// The real etcd and HTTP stores against a loopback server that answers
// every request with bytes of the input (store_fuzz.cc).
void FuzzEtcdJson(std::string_view in);
void FuzzHttpStore(std::string_view in);
#endif

struct Target {
  const char* name;  // "fuzz_frames": the binary, corpus/<name>/, regressions/<name>/
  void (*run)(std::string_view in);
  // The share of the replay's mutations this target gets, per mille of the
  // count per target (targets that talk to a server are slower).
  int replay_share;
};

// Every target this build has, in a fixed order.
const std::vector<Target>& Targets();

// Valid inputs of `target` made with the real encoders (the seed corpus is
// generated from these: make_corpus.cc).
std::vector<std::string> Seeds(std::string_view target);

}  // namespace ferry::fuzz
