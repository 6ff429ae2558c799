// The chain over the credential sources (s3_credential_sources.h), with the
// caching and refresh rules s3_credentials.h describes, and where the
// process environment puts each source.
//
// Thread-safety: the providers made here are safe to use from several
// threads; AwsCredentialSettingsFromProcess reads the environment and may
// read the AWS config file.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/store/s3/s3_credential_sources.h"
#include "stitch/store/s3/s3_credentials.h"

namespace stitch {

// A provider over `sources`, tried in order, with the default chain's
// caching and refresh rules (s3_credentials.h; `options`).
std::shared_ptr<AwsCredentialsProvider> MakeCredentialsChain(
    std::vector<std::unique_ptr<AwsCredentialSource>> sources, AwsCredentialsOptions options);

// The SDKs' default chain over `static_keys` (the environment's keys; an
// empty access key id skips that source) and the other sources of
// `settings`. InvalidArgument when only one of the access key id and the
// secret is set.
[[nodiscard]] absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> MakeDefaultCredentialsChain(
    const AwsCredentials& static_keys, const AwsCredentialSettings& settings,
    AwsCredentialsOptions options = {});

// The settings the SDKs would use in this process: every field from its
// environment variable, with the SDKs' defaults (~/.aws files, the
// container host, the instance metadata endpoint unless
// AWS_EC2_METADATA_DISABLED=true, the region from the config file).
AwsCredentialSettings AwsCredentialSettingsFromProcess();

}  // namespace stitch
