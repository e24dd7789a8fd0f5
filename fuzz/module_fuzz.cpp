// Fuzz target: deserialize_module with every kind of models/ registered, on a HostDevice. Oracle:
// a tree it rebuilds serializes to JSON that deserializes to a tree serializing the same way.
#include "engine/host_device.h"
#include "engine/module_io.h"
#include "fuzz/fuzz_common.h"
#include "models/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::optional<nlohmann::json> j = zc::fuzz::parse_json(data, size);
  if (!j) return 0;
  static const zc::ModuleRegistry registry = zc::model_registry();
  zc::HostDevice dev;
  return zc::fuzz::run_contract([&] {
    const std::unique_ptr<zc::Module> m = zc::deserialize_module(*j, registry, dev);
    const nlohmann::json once = zc::serialize_module(*m, dev);
    const std::unique_ptr<zc::Module> again = zc::deserialize_module(once, registry, dev);
    zc::fuzz::check(zc::serialize_module(*again, dev) == once,
                    "module changed in a serialize round trip: " + once.dump());
  });
}
