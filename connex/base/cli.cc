#include "connex/base/cli.h"

#include <cstdlib>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/logging_spdlog.h"
#include "connex/base/strings.h"

namespace connex {
namespace cli {

Validator::Validator(std::function<std::string(std::string&)> check, std::string description)
    : impl_(std::make_shared<const CLI::Validator>(std::move(check), std::move(description))) {}
Validator::~Validator() = default;
Validator::Validator(const Validator&) = default;
Validator& Validator::operator=(const Validator&) = default;

namespace {
template <class V>
Validator Make(V v) {
  return Validator(std::make_shared<const CLI::Validator>(std::move(v)));
}
}  // namespace

Validator RangeOfInts(int64_t min, int64_t max) { return Make(CLI::Range(min, max)); }
Validator RangeOfUints(uint64_t min, uint64_t max) { return Make(CLI::Range(min, max)); }
Validator RangeOfFloats(double min, double max) { return Make(CLI::Range(min, max)); }
Validator IsMember(std::vector<std::string> names, bool ignore_case) {
  if (ignore_case) return Make(CLI::IsMember(std::move(names), CLI::ignore_case));
  return Make(CLI::IsMember(std::move(names)));
}
Validator CheckedTransformer(std::map<std::string, bool> words) {
  return Make(CLI::CheckedTransformer(std::move(words)));
}
const Validator PositiveNumber = Make(CLI::PositiveNumber);
const Validator NonNegativeNumber = Make(CLI::NonNegativeNumber);
const Validator ExistingFile = Make(CLI::ExistingFile);

Option* Option::envname(std::string name) {
  impl_->envname(std::move(name));
  return this;
}
Option* Option::check(const Validator& validator) {
  impl_->check(validator.impl());
  return this;
}
Option* Option::check(std::function<std::string(const std::string&)> check,
                      std::string description) {
  impl_->check(std::move(check), std::move(description));
  return this;
}
Option* Option::transform(const Validator& validator) {
  impl_->transform(validator.impl());
  return this;
}
Option* Option::capture_default_str() {
  impl_->capture_default_str();
  return this;
}
Option* Option::default_str(std::string text) {
  impl_->default_str(std::move(text));
  return this;
}
Option* Option::required(bool value) {
  impl_->required(value);
  return this;
}
Option* Option::excludes(Option* other) {
  impl_->excludes(other->impl_);
  return this;
}
Option* Option::needs(Option* other) {
  impl_->needs(other->impl_);
  return this;
}
Option* Option::group(std::string name) {
  impl_->group(std::move(name));
  return this;
}
Option* Option::delimiter(char separator) {
  impl_->delimiter(separator);
  return this;
}
size_t Option::count() const { return impl_->count(); }
std::string Option::get_name() const { return impl_->get_name(); }
int Option::get_expected_min() const { return impl_->get_expected_min(); }
template <class T>
T Option::as() const {
  return impl_->as<T>();
}
template std::string Option::as() const;

App::App(std::string description, std::string name)
    : owned_(std::make_unique<CLI::App>(std::move(description), std::move(name))),
      impl_(owned_.get()) {}
App::App(CLI::App* impl) : impl_(impl) {}
App::~App() = default;

Option* App::Wrap(CLI::Option* option) { return &options_.emplace_back(option); }

template <class T>
requires(!std::is_const_v<T> &&
         !std::is_array_v<T>) Option* App::add_option(std::string name, T& variable,
                                                      std::string description) {
  return Wrap(impl_->add_option(std::move(name), variable, std::move(description)));
}
// The types the programs bind (a new one: add it here).
template Option* App::add_option(std::string, std::string&, std::string);
template Option* App::add_option(std::string, bool&, std::string);
template Option* App::add_option(std::string, int&, std::string);
template Option* App::add_option(std::string, unsigned&, std::string);
template Option* App::add_option(std::string, long&, std::string);
template Option* App::add_option(std::string, unsigned long&, std::string);
template Option* App::add_option(std::string, long long&, std::string);
template Option* App::add_option(std::string, unsigned long long&, std::string);
template Option* App::add_option(std::string, uint16_t&, std::string);
template Option* App::add_option(std::string, float&, std::string);
template Option* App::add_option(std::string, double&, std::string);
template Option* App::add_option(std::string, std::vector<std::string>&, std::string);
template Option* App::add_option(std::string, std::vector<int>&, std::string);
template Option* App::add_option(std::string, std::vector<int64_t>&, std::string);
template Option* App::add_option(std::string, std::vector<double>&, std::string);

Option* App::add_option(std::string name, const char* description) {
  const std::string text = description;  // CLI11: a const string is the description
  return Wrap(impl_->add_option(std::move(name), text));
}
Option* App::add_option_function(std::string name, std::function<void(const std::string&)> callback,
                                 std::string description) {
  return Wrap(impl_->add_option_function<std::string>(std::move(name), std::move(callback),
                                                      std::move(description)));
}
Option* App::add_flag(std::string name, bool& variable, std::string description) {
  return Wrap(impl_->add_flag(std::move(name), variable, std::move(description)));
}
Option* App::add_flag(std::string name, const char* description) {
  const std::string text = description;  // CLI11: a const string is the description
  return Wrap(impl_->add_flag(std::move(name), text));
}
Option* App::add_flag_callback(std::string name, std::function<void()> callback,
                               std::string description) {
  return Wrap(
      impl_->add_flag_callback(std::move(name), std::move(callback), std::move(description)));
}

App* App::add_subcommand(std::string name, std::string description) {
  CLI::App* sub = impl_->add_subcommand(std::move(name), std::move(description));
  return subcommands_.emplace_back(new App(sub)).get();
}
App* App::require_subcommand(int count) {
  impl_->require_subcommand(count);
  return this;
}
App* App::fallthrough(bool value) {
  impl_->fallthrough(value);
  return this;
}
App* App::alias(std::string name) {
  impl_->alias(std::move(name));
  return this;
}
bool App::parsed() const { return impl_->parsed(); }
std::vector<App*> App::get_subcommands() const {
  std::vector<App*> out;
  for (const std::unique_ptr<App>& sub : subcommands_) out.push_back(sub.get());
  return out;
}
std::string App::get_name() const { return impl_->get_name(); }
bool App::check_name(const std::string& word) const { return impl_->check_name(word); }
Option* App::get_option_no_throw(const std::string& name) {
  const CLI::Option* found = impl_->get_option_no_throw(name);
  if (found == nullptr) return nullptr;
  for (Option& option : options_) {
    if (option.impl_ == found) return &option;
  }
  return nullptr;
}

}  // namespace cli

cli::Option* AddLogLevelFlag(cli::App& app, std::string_view default_level) {
  const cli::Validator names(
      [](std::string& text) -> std::string {
        absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(text);
        return level.ok() ? std::string() : std::string(level.status().message());
      },
      "LEVEL");
  cli::Option* option = app.add_option_function(
      "--log-level",
      [](const std::string& text) {
        absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(text);
        if (level.ok()) Log().set_level(*level);
      },
      StrCat("log level: ", kLogLevelNames));
  option->envname("CONNEX_LOG_LEVEL")->check(names)->default_str(std::string(default_level));
  option->impl().force_callback();
  return option;
}

cli::Option* AddInsecureFlag(cli::App& app) {
  return app.add_flag_callback(
      "--insecure", [] { setenv("CONNEX_INSECURE", "1", 1); },
      "listen beyond loopback without authentication (CONNEX_INSECURE=1): the data plane and "
      "HTTP always, ZeroMQ sockets without a CURVE key pair");
}

cli::Option* AddRefusedSecretFlag(cli::App& app, const std::string& name,
                                  const std::string& use_instead) {
  return app
      .add_option(name, "")
      // Validators run on every value given, so this one refuses each of them.
      ->check(cli::Validator(
          [use_instead](std::string&) -> std::string {
            return "a secret is never taken from the command line (ps shows it to every user); "
                   "use " +
                   use_instead;
          },
          ""))
      ->group("");  // hidden from --help
}

cli::Validator SizeRange(uint64_t min, uint64_t max, bool list) {
  return cli::Validator(
      [min, max, list](std::string& text) -> std::string {
        std::vector<std::string> items;
        if (list) {
          items = absl::StrSplit(text, ',');
        } else {
          items = {text};
        }
        for (const std::string& item : items) {
          absl::StatusOr<uint64_t> size = ParseSize(item);
          if (!size.ok()) return std::string(size.status().message());
          if (*size < min || *size > max) {
            return StrCat(item, " (", *size, " bytes) is outside the limits [", min, ", ", max,
                          "] bytes");
          }
        }
        return std::string();
      },
      list ? "SIZE,..." : "SIZE");
}

std::string VersionText(std::string_view program) {
  const size_t slash = program.rfind('/');
  if (slash != std::string_view::npos) program.remove_prefix(slash + 1);
  return StrCat(program.empty() ? "connex" : program, " ", CONNEX_VERSION);
}

std::optional<int> ParseFlags(cli::App& flags, int argc, char** argv,
                              const std::function<void()>& also) {
  CLI::App& app = flags.impl();
  if (app.get_version_ptr() == nullptr) {
    app.set_version_flag("--version", VersionText(argc > 0 ? argv[0] : ""),
                         "print the program's name and Connex version, then exit");
  }
  try {
    app.parse(argc, argv);
    if (also) {
      try {
        also();
      } catch (const cli::ValidationError& e) {
        throw CLI::ValidationError(e.name(), e.what());
      } catch (const cli::RequiredError& e) {
        throw CLI::RequiredError(e.what());
      }
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageExitCode;
  }
  return std::nullopt;
}

}  // namespace connex
