# Elasticsearch 9.1 with the Korean analysis plugin (nori) for the opensearch-lsr Elasticsearch backend.
# analysis-nori is not bundled with Elasticsearch: the Korean text field of mappings/elasticsearch/ needs it
# (without it the toolkit falls back to the cjk analyzer).
FROM docker.elastic.co/elasticsearch/elasticsearch:9.1.0
RUN bin/elasticsearch-plugin install --batch analysis-nori
