# OpenSearch 3.3 (ML Commons and neural-search are bundled in the official image) + analysis-nori.
FROM opensearchproject/opensearch:3.3.0
RUN /usr/share/opensearch/bin/opensearch-plugin install --batch analysis-nori
