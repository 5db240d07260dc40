#include "server/flag_names.h"

namespace prefixd {

std::vector<std::string> NormalizeFlagNames(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (i == 0 || flags_done || a.size() < 2 || a[0] != '-') {
      out.push_back(std::move(a));
      continue;
    }
    if (a == "--") {
      flags_done = true;
      out.push_back(std::move(a));
      continue;
    }
    const size_t start = a[1] == '-' ? 2 : 1;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t j = start; j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<std::string> RepeatedFlagValues(const std::vector<std::string>& args,
                                            const std::string& name) {
  std::vector<std::string> out;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    for (const std::string& dashes : {std::string("--"), std::string("-")}) {
      const std::string flag = dashes + name;
      if (a == flag && i + 1 < args.size()) {
        out.push_back(args[++i]);
        break;
      }
      if (a.size() > flag.size() && a.compare(0, flag.size(), flag) == 0 &&
          a[flag.size()] == '=') {
        out.push_back(a.substr(flag.size() + 1));
        break;
      }
    }
  }
  return out;
}

}  // namespace prefixd
